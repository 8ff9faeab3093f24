"""The call-id policy on both faces of the coordinator (flowmem.call_ids).

``strict`` (the default) is MEM-2 as the spec states it, and a dropped turn is
reported in the append's result (``dropped_turns``), never silent. ``per_turn``
keeps each new call of a reused id, gives the caller's ids back on every read
(history, read, the append's messages and tail, pop), refuses ids of the alias
shape, and keys idempotency records by policy. A Hypothesis property: with no id
reused, ``per_turn`` stores exactly what ``strict`` stores; in an agent loop whose
model reuses ids, ``per_turn`` keeps every turn and the history reads sendable.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flowmem
from flowmem.call_ids import caller_id, check_call_ids, fingerprint
from flowmem.errors import InvalidInput, InvalidMessage
from flowmem.normalize import repair_pairing

CONTEXT = flowmem.ExecutionContext(workflow_id="w")


def turn(call: str, arguments: str = "{}") -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call, "type": "function", "function": {"name": "f", "arguments": arguments}}]}


def result(call: str, content: str = "ok") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call, "content": content}


def loop(calls: list[str]) -> list[list[dict[str, Any]]]:
    """An agent loop: a question, then per call a turn (new arguments) and its result."""
    batches = [[{"role": "user", "content": "q"}]]
    for n, call in enumerate(calls):
        batches += [[turn(call, f'{{"n": {n}}}')], [result(call, f"r{n}")]]
    return batches


@pytest.fixture(params=["memory://", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return "memory://" if request.param == "memory://" else f"sqlite:///{tmp_path / 'c.db'}"


def test_strict_reports_the_dropped_turn(url: str) -> None:
    with flowmem.Memory.from_url(url) as memory:
        assert memory.call_ids == "strict"
        for batch in loop(["1"]):
            memory.append("workflow", "k", batch, context=CONTEXT)
        again = memory.append("workflow", "k", turn("1", '{"n": 9}'), context=CONTEXT)
        assert (again.appended, again.dropped_turns) == (0, 1)
        assert again.to_dict()["dropped_turns"] == 1


def test_per_turn_keeps_every_call_and_reads_the_callers_ids(url: str) -> None:
    with flowmem.Memory.from_url(url, call_ids="per_turn") as memory:
        for batch in loop(["1", "1", "1"]):
            last = memory.append("workflow", "k", batch, context=CONTEXT, tail=2)
        assert last.count == 7 and last.appended == 1
        assert [m["metadata"].get("tool_call_id") for m in last.tail.messages] == [None, "1"]
        history = memory.history("workflow", "k", context=CONTEXT).messages
        ids = [m["metadata"].get("tool_call_id") or m["metadata"].get("tool_calls", [{}])[0]
               .get("id") for m in history[1:]]
        assert ids == ["1"] * 6
        assert last.messages == history
        assert memory.read("workflow", "k", context=CONTEXT).value == history
        stored = memory.with_call_ids("strict").history("workflow", "k", context=CONTEXT)
        assert len({m["metadata"].get("tool_call_id") for m in stored.messages[1:]
                    if m["role"] == "tool"}) == 3  # each call under its own stored id
        budgeted = memory.history("workflow", "k", context=CONTEXT, max_tokens=10_000)
        assert budgeted.messages == history  # repaired on the stored ids: nothing dropped
        popped = memory.pop("workflow", "k", context=CONTEXT)
        assert popped is not None and popped["metadata"]["tool_call_id"] == "1"


def test_async_face_per_turn(tmp_path: Path) -> None:
    async def run() -> None:
        async with flowmem.AsyncMemory.from_url(f"sqlite:///{tmp_path / 'a.db'}",
                                                call_ids="per_turn") as memory:
            for batch in loop(["x", "x"]):
                last = await memory.append("workflow", "k", batch, context=CONTEXT)
            loaded = await last.load_messages()
            assert [m["metadata"].get("tool_call_id") for m in loaded][-1] == "x"
            assert len(loaded) == 5

    asyncio.run(run())


def test_policy_and_alias_shaped_ids_are_refused() -> None:
    with pytest.raises(InvalidInput, match="call_ids"):
        flowmem.Memory.from_url("memory://", call_ids="loose")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        check_call_ids(None)
    with flowmem.Memory.from_url("memory://", call_ids="per_turn") as memory:
        with pytest.raises(InvalidMessage, match="alias"):
            memory.append("workflow", "k", turn("1\x1f0123456789ab"), context=CONTEXT)
        with pytest.raises(InvalidMessage, match="alias"):  # in another id's alias range
            memory.append("workflow", "k", turn("1\x1fnot-hex"), context=CONTEXT)
        assert memory.history("workflow", "k", context=CONTEXT).messages == []
    with flowmem.Memory.from_url("memory://") as strict:  # strict takes any id as it is
        strict.append("workflow", "k", turn("1\x1f0123456789ab"), context=CONTEXT)


def test_idempotency_keys_tell_the_policies_apart() -> None:
    with flowmem.Memory.from_url("memory://") as memory:
        memory.append("workflow", "k", turn("1"), context=CONTEXT, idempotency_key="i")
        with pytest.raises(flowmem.IdempotencyConflict):
            memory.with_call_ids("per_turn").append("workflow", "k", turn("1"),
                                                   context=CONTEXT, idempotency_key="i")


def test_fingerprint_and_caller_id() -> None:
    one, other = turn("1", "{}"), turn("1", '{"n": 1}')
    assert fingerprint(one, "1") != fingerprint(other, "1")
    assert fingerprint({**one, "metadata": {"id": "m1"}}, "1") != fingerprint(
        {**one, "metadata": {"id": "m2"}}, "1")
    assert caller_id(f"1\x1f{fingerprint(one, '1')}") == "1"
    assert caller_id("1\x1fnot-hex") == "1\x1fnot-hex"


IDS = st.sampled_from(["a", "b", "c"])
STEP = st.one_of(
    st.builds(lambda: [{"role": "user", "content": "u"}]),
    st.builds(lambda c, n: [turn(c, f'{{"n": {n}}}')], IDS, st.integers(0, 3)),
    st.builds(lambda c: [result(c)], IDS),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(STEP, max_size=12))
def test_per_turn_is_strict_when_no_id_is_declared_twice(steps: list[Any]) -> None:
    seen: set[str] = set()
    unique = []
    for step in steps:  # keep only the first turn declaring each id
        message = step[0]
        if message["role"] == "assistant":
            call = message["tool_calls"][0]["id"]
            if call in seen:
                continue
            seen.add(call)
        unique.append(step)
    strict, per_turn = flowmem.ConversationBuffer(), flowmem.ConversationBuffer(
        call_ids="per_turn")
    for step in unique:
        one, two = strict.append(step), per_turn.append(step)
        assert (one.count, one.appended) == (two.count, two.appended)
    assert strict.messages == per_turn.messages


@settings(max_examples=40, deadline=None)
@given(st.lists(IDS, min_size=1, max_size=8))
def test_per_turn_keeps_an_agent_loop_that_reuses_ids(calls: list[str]) -> None:
    with flowmem.Memory.from_url("memory://", call_ids="per_turn") as memory:
        batches = loop(calls)
        for batch in batches:
            assert memory.append("workflow", "k", batch, context=CONTEXT).appended == 1
        refired = memory.append("workflow", "k", batches[-1], context=CONTEXT)
        assert (refired.appended, refired.dropped_results) == (0, 1)  # MEM-1 on the newest
        if calls[-1] in calls[:-1]:  # a copy of a re-declaration: MEM-2 (the documented
            copy = memory.append("workflow", "k", batches[-2], context=CONTEXT)  # bound: not
            assert (copy.appended, copy.dropped_turns) == (0, 1)  # of a first declaration)
        history = memory.history("workflow", "k", context=CONTEXT).messages
        assert len(history) == 1 + 2 * len(calls)
        assert [m["content"] for m in history if m["role"] == "tool"] == [
            f"r{n}" for n in range(len(calls))]
        stored = memory.with_call_ids("strict").history("workflow", "k", context=CONTEXT)
        assert flowmem.normalize(stored.messages).dropped == 0  # every call paired


def test_a_per_turn_history_is_sendable_under_its_policy() -> None:  # MEM-5
    """A per-turn history comes back with the caller's ids: the same id in two turns,
    each answered in its own block. Strict (MEM-5 as stated) removes the later
    declaration; per_turn judges it sendable and normalizes it to itself."""
    with flowmem.Memory.from_url("memory://", call_ids="per_turn") as memory:
        for batch in loop(["1", "1"]):
            memory.append("workflow", "k", batch, context=CONTEXT)
        history = memory.history("workflow", "k", context=CONTEXT).messages
    assert flowmem.sendability_problems(history, call_ids="per_turn") == []
    assert flowmem.is_sendable(history, call_ids="per_turn")
    assert not flowmem.is_sendable(history)  # strict: "1" is declared twice
    flat = flowmem.normalize(history, call_ids="per_turn")
    assert flat.dropped == 0 and len(flat.messages) == 5
    assert flowmem.normalize(flat.messages, call_ids="per_turn") == flat
    assert flowmem.normalize(history).dropped == 3  # strict: the call, its turn, its result
    repaired, dropped = repair_pairing(history, call_ids="per_turn")
    assert (repaired, dropped) == (history, 0)


def test_per_turn_normalize_pairs_a_result_with_the_newest_declaration() -> None:
    messages = [{"role": "user", "content": "q"}, turn("1"), turn("1", '{"n": 1}'),
                result("1", "late"), {"role": "assistant", "content": "x", "tool_calls": [
                    {"id": "1", "type": "function", "function": {"name": "f"}},
                    {"id": "1", "type": "function", "function": {"name": "g"}}]}]
    out = flowmem.normalize(messages, call_ids="per_turn")
    assert [m.get("tool_call_id") for m in out.messages] == [None, None, "1", None, "1",
                                                              None, "1"]
    assert out.messages[2]["content"] == flowmem.HEALED_CONTENT  # the first: interrupted
    assert out.messages[4]["content"] == "late" and out.dropped == 1  # a turn's repeat
    assert flowmem.is_sendable(out.messages, call_ids="per_turn")
    problems = flowmem.sendability_problems([*messages[:4], result("1")], call_ids="per_turn")
    assert any("answered twice" in p for p in problems)


@pytest.mark.parametrize("face", ["sync", "async"])
def test_per_turn_edit_keeps_the_stored_ids(face: str, tmp_path: Path) -> None:  # MEM-15
    """An edit through a per-turn memory names the caller's ids; the entry keeps its
    declaration's alias, so the pairing (MEM-1, MEM-10) goes on as before."""
    url = f"sqlite:///{tmp_path / 'e.db'}"

    async def run() -> tuple[list[Any], list[Any]]:
        async with flowmem.AsyncMemory.from_url(url, call_ids="per_turn") as memory:
            for batch in [*loop(["1", "1"]), [turn("1", '{"n": 2}')]]:
                await memory.append("workflow", "k", batch, context=CONTEXT)
            page = await memory.history("workflow", "k", context=CONTEXT)
            edited = {**page.messages[4], "content": "edited"}
            assert await memory.edit("workflow", "k", page.positions[4], edited,
                                     context=CONTEXT)
            newest = turn("1", '{"n": 2, "edited": true}')
            assert await memory.edit("workflow", "k", page.positions[5], newest,
                                     context=CONTEXT)
            late = await memory.append("workflow", "k", result("1", "r2"), context=CONTEXT)
            assert late.appended == 1
            again = await memory.append("workflow", "k", result("1", "r2"), context=CONTEXT)
            assert again.dropped_results == 1
            stored = await memory.with_call_ids("strict").history("workflow", "k",
                                                                   context=CONTEXT)
            return (await memory.history("workflow", "k", context=CONTEXT)).messages, \
                stored.messages

    if face == "async":
        mine, stored = asyncio.run(run())
    else:
        with flowmem.Memory.from_url(url, call_ids="per_turn") as memory:
            for batch in [*loop(["1", "1"]), [turn("1", '{"n": 2}')]]:
                memory.append("workflow", "k", batch, context=CONTEXT)
            page = memory.history("workflow", "k", context=CONTEXT)
            assert memory.edit("workflow", "k", page.positions[4],
                               {**page.messages[4], "content": "edited"}, context=CONTEXT)
            assert memory.edit("workflow", "k", page.positions[5],
                               turn("1", '{"n": 2, "edited": true}'), context=CONTEXT)
            assert memory.append("workflow", "k", result("1", "r2"),
                                 context=CONTEXT).appended == 1
            assert memory.append("workflow", "k", result("1", "r2"),
                                 context=CONTEXT).dropped_results == 1
            mine = memory.history("workflow", "k", context=CONTEXT).messages
            stored = memory.with_call_ids("strict").history("workflow", "k",
                                                            context=CONTEXT).messages
    assert [m["content"] for m in mine if m["role"] == "tool"] == ["r0", "edited", "r2"]
    assert flowmem.is_sendable(mine, call_ids="per_turn")
    assert flowmem.normalize(stored).dropped == 0  # each declaration keeps its own id
    assert len({m["metadata"]["tool_call_id"] for m in stored if m["role"] == "tool"}) == 3


def test_per_turn_pop_keeps_the_pairing(url: str) -> None:
    """Popping a result reopens its declaration (the next result answers it there);
    popping a re-declaration leaves the id's earlier, answered one newest (MEM-1)."""
    with flowmem.Memory.from_url(url, call_ids="per_turn") as memory:
        for batch in loop(["1", "1"]):
            memory.append("workflow", "k", batch, context=CONTEXT)
        popped = memory.pop("workflow", "k", context=CONTEXT)
        assert popped is not None and popped["metadata"]["tool_call_id"] == "1"
        assert memory.append("workflow", "k", result("1", "again"), context=CONTEXT).appended
        memory.pop("workflow", "k", context=CONTEXT)
        declared = memory.pop("workflow", "k", context=CONTEXT)
        assert declared is not None and declared["metadata"]["tool_calls"][0]["id"] == "1"
        late = memory.append("workflow", "k", result("1", "late"), context=CONTEXT)
        assert (late.appended, late.dropped_results) == (0, 1)
        mine = memory.history("workflow", "k", context=CONTEXT).messages
        assert [m["content"] for m in mine if m["role"] == "tool"] == ["r0"]
        assert flowmem.is_sendable(mine[1:], call_ids="per_turn")


class _Reference:
    """A naive model of both policies over one conversation (O(length) per step; MEM-1,
    MEM-2, MEM-3, MEM-10 and a pop), written apart from the planner to check it.

    An entry is ``["turn", declaration]``, ``["tool", declaration, content]`` or
    ``["user"]``; a declaration is ``[caller's id, arguments]`` (one call per turn)."""

    def __init__(self, per_turn: bool) -> None:
        self.per_turn = per_turn
        self.entries: list[list[Any]] = []

    def _decls(self, call: str) -> list[list[Any]]:
        return [e[1] for e in self.entries if e[0] == "turn" and e[1][0] == call]

    def _result(self, decl: list[Any]) -> list[Any] | None:
        return next((e for e in self.entries if e[0] == "tool" and e[1] is decl), None)

    def turn(self, call: str, arguments: str) -> tuple[int, int]:
        decls = self._decls(call)
        if decls and (not self.per_turn or self._result(decls[-1]) is None
                      or any(d[1] == arguments for d in decls)):
            return 0, 1  # MEM-2: declared (strict), open, or a copy of a declaration
        self.entries.append(["turn", [call, arguments]])
        return 1, 0

    def result(self, call: str, content: str) -> int:
        decls = self._decls(call)
        if not decls:
            return 0  # not generated (an orphan): see the test
        decl = decls[-1] if self.per_turn else decls[0]
        held = self._result(decl)
        if held is None:
            self.entries.append(["tool", decl, content])
            return 1
        if held[2] == flowmem.HEALED_CONTENT:
            held[2] = content  # MEM-10: in place
        return 0

    def user(self) -> None:
        for index in range(len(self.entries) - 1, -1, -1):
            entry = self.entries[index]
            if entry[0] == "turn" and self._result(entry[1]) is None:
                end = index + 1
                while end < len(self.entries) and self.entries[end][0] == "tool":
                    end += 1
                self.entries.insert(end, ["tool", entry[1], flowmem.HEALED_CONTENT])
        self.entries.append(["user"])

    def pop(self) -> None:
        if self.entries:
            self.entries.pop()

    def contents(self) -> list[tuple[str, str | None]]:
        """Per entry: its role and, for a result, its content."""
        return [(e[0], e[2] if e[0] == "tool" else None) for e in self.entries]


POLICY_STEP = st.one_of(
    st.tuples(st.just("turn"), st.sampled_from(["a", "b"]), st.sampled_from(["{}", "{\"n\": 1}"])),
    st.tuples(st.just("tool"), st.sampled_from(["a", "b"]), st.sampled_from(["r1", "r2"])),
    st.tuples(st.just("user")), st.tuples(st.just("pop")))


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["strict", "per_turn"]), st.lists(POLICY_STEP, max_size=16))
def test_both_policies_equal_a_reference_model(policy: str, steps: list[Any]) -> None:
    """MEM-1/2/3/10 under each call-id policy against :class:`_Reference`: every append's
    ``appended`` and ``dropped_turns`` (a strict drop is reported, never silent), the
    contents the caller reads back, late results replacing the NEWEST declaration's
    placeholder, copies of any declaration (the first too) dropped, pops; the history
    normalizes under its policy with nothing dropped, to a sendable list."""
    reference = _Reference(policy == "per_turn")
    with flowmem.Memory.from_url("memory://", call_ids=policy) as memory:  # type: ignore[arg-type]
        memory.append("workflow", "k", {"role": "user", "content": "q"}, context=CONTEXT)
        reference.user()
        for step in steps:
            if step[0] == "turn":
                got = memory.append("workflow", "k", turn(step[1], step[2]), context=CONTEXT)
                assert (got.appended, got.dropped_turns) == reference.turn(step[1], step[2])
            elif step[0] == "tool":
                if not reference._decls(step[1]):
                    continue  # orphans are not this test's
                got = memory.append("workflow", "k", result(step[1], step[2]), context=CONTEXT)
                assert got.appended == reference.result(step[1], step[2])
            elif step[0] == "user":
                memory.append("workflow", "k", {"role": "user", "content": "u"}, context=CONTEXT)
                reference.user()
            else:
                memory.pop("workflow", "k", context=CONTEXT)
                reference.pop()
            history = memory.history("workflow", "k", context=CONTEXT).messages
            assert [(m["role"] if m["role"] != "assistant" else "turn",
                     m["content"] if m["role"] == "tool" else None)
                    for m in history] == reference.contents()
        history = memory.history("workflow", "k", context=CONTEXT).messages
        flat = flowmem.normalize(history, call_ids=policy)  # type: ignore[arg-type]
        assert flat.dropped == 0
        assert flowmem.is_sendable(flat.messages, call_ids=policy)  # type: ignore[arg-type]
