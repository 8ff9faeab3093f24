"""The conformance tests of the ``per_turn`` call-id policy (:mod:`flowmem.call_ids`).

Every store runs the plan the policy gives, unchanged: the expected buffers come
from a :class:`~flowmem.ConversationBuffer` under the same policy (the stored
form, aliases included), and the caller's ids come back through
:func:`~flowmem.call_ids.caller_messages`.
"""

from __future__ import annotations

from typing import Any

from ..buffer import ConversationBuffer
from ..call_ids import PerTurn, caller_messages
from ..messages import HEALED_CONTENT, Message, canonical_messages
from ..scopes import StorageKey
from ..store import Store
from ._contract_messages import fresh_key, tool, user

__all__ = ["CallIdsContract"]


def _turn(call: str, arguments: str, message_id: str | None = None) -> Message:
    message: Message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": call, "type": "function", "function": {"name": "f", "arguments": arguments}}]}
    if message_id is not None:
        message["id"] = message_id
    return message


def _run(store: Store, batches: list[list[Message]], window: int | None = None,
         ) -> tuple[StorageKey, ConversationBuffer, list[tuple[int, int]]]:
    """Append each batch under ``per_turn`` to the store and to the model; the key, the
    model and the store's ``(count, appended)`` per batch (checked against the model's)."""
    key = fresh_key()
    model = ConversationBuffer(max_messages=window, call_ids="per_turn")
    reports = []
    for batch in batches:
        expected = model.append(batch)
        outcome = store.append(key, PerTurn(canonical_messages(batch)), max_messages=window,
                               lock_timeout=5.0)
        assert (outcome.count, outcome.appended) == (expected.count, expected.appended)
        reports.append((outcome.count, outcome.appended))
    found, stored = store.read(key)
    assert found and stored == model.messages
    return key, model, reports


def _ids(messages: list[Any]) -> list[tuple[str, str | None]]:
    out = []
    for message in messages:
        meta = message["metadata"]
        calls = meta.get("tool_calls") or ()
        out.append((message["role"], meta.get("tool_call_id")
                    or ",".join(c["id"] for c in calls) or None))
    return out


class CallIdsContract:
    """The ``per_turn`` policy on a store (mixed into :class:`~flowmem.testing.StoreContract`)."""

    def test_per_turn_reused_id_starts_a_new_declaration(self, store: Store) -> None:
        batches = [[user("q")]]
        for n in range(3):  # a model reusing call id "1", new arguments each turn
            batches += [[_turn("1", f'{{"n": {n}}}')], [tool("1", f"r{n}")]]
        batches += [[_turn("1", '{"n": 2}')],  # a copy of the last declaration: MEM-2
                    [tool("1", "again")]]  # a re-fired result: MEM-1
        key, model, reports = _run(store, batches)
        assert [appended for _, appended in reports] == [1, 1, 1, 1, 1, 1, 1, 0, 0]
        mine = caller_messages(model.messages)
        assert _ids(mine) == [("user", None), *[("assistant", "1"), ("tool", "1")] * 3]
        assert [m["content"] for m in mine if m["role"] == "tool"] == ["r0", "r1", "r2"]
        assert store.history(key, last=2).messages == model.messages[-2:]

    def test_per_turn_heals_each_open_declaration(self, store: Store) -> None:  # MEM-3
        batches = [[user("q"), _turn("1", "{}"), tool("1", "r")],
                   [_turn("1", '{"n": 1}'), user("next")],
                   [tool("1", "late")]]  # MEM-10: the newest declaration's placeholder
        _, model, reports = _run(store, batches)
        mine = caller_messages(model.messages)
        assert _ids(mine) == [("user", None), ("assistant", "1"), ("tool", "1"),
                              ("assistant", "1"), ("tool", "1"), ("user", None)]
        assert mine[4]["content"] == "late" and "healed" not in mine[4]["metadata"]
        assert reports[-1] == (6, 0)

    def test_per_turn_late_result_replaces_the_newest_placeholder(self, store: Store,
                                                                  ) -> None:  # MEM-10
        """Each declaration of a reused id healed in turn: a late result replaces the
        placeholder of the id's NEWEST declaration, never an older one's, in a later
        append or in the one that healed it; a second result is a duplicate (MEM-1)."""
        batches = [[user("q"), _turn("1", "{}"), user("stop")],
                   [_turn("1", '{"n": 1}'), user("stop again")],
                   [tool("1", "late")], [tool("1", "later")],
                   [_turn("1", '{"n": 2}'), user("and again"), tool("1", "at once")]]
        _, model, reports = _run(store, batches)
        mine = caller_messages(model.messages)
        contents = [m["content"] for m in mine if m["role"] == "tool"]
        assert contents == [HEALED_CONTENT, "late", "at once"]
        assert [appended for _, appended in reports] == [3, 2, 0, 0, 2]
        assert mine[2]["metadata"]["healed"] is True

    def test_per_turn_copy_of_the_first_declaration_is_a_duplicate(self, store: Store,
                                                                   ) -> None:  # MEM-2
        """A copy of an id's first declaration, sent after it was answered and after the
        id was declared again, is a MEM-2 duplicate, as a copy of a later one is."""
        first, second = _turn("1", "{}", "m1"), _turn("1", '{"n": 1}', "m2")
        batches = [[user("q"), first, tool("1", "r1")], [second, tool("1", "r2")],
                   [first], [second], [first, tool("1", "again")],
                   [user("next"), _turn("2", "{}"), tool("2", "s"), _turn("2", "{}"),
                    _turn("2", '{"n": 1}'), tool("2", "s2")]]
        _, model, reports = _run(store, batches)
        assert [appended for _, appended in reports] == [3, 2, 0, 0, 0, 5]
        mine = caller_messages(model.messages)
        assert [m["content"] for m in mine if m["role"] == "tool"] == ["r1", "r2", "s", "s2"]

    def test_per_turn_redeclaring_an_open_id_is_a_duplicate(self, store: Store) -> None:
        batches = [[user("q"), _turn("1", "{}")], [_turn("1", '{"n": 1}')],
                   [tool("1", "r")], [tool("1", "r")]]
        _, model, reports = _run(store, batches)
        assert [appended for _, appended in reports] == [2, 0, 1, 0]
        assert _ids(model.messages) == [("user", None), ("assistant", "1"), ("tool", "1")]

    def test_per_turn_first_declaration_is_the_earliest_turn(self, store: Store,
                                                             ) -> None:  # MEM-2
        """A turn declaring a new id and re-declaring an open one with other arguments is
        not the open id's first declaration: after healing, a copy of each first
        declaration is a duplicate, whichever id's turn a store reads first."""
        two: Message = {"role": "assistant", "content": None, "tool_calls": [
            {"id": call, "type": "function", "function": {"name": "f", "arguments": args}}
            for call, args in (("a", "{}"), ("b", '{"n": 1}'))]}
        both: Message = {**two, "tool_calls": [
            {**entry, "function": {"name": "f", "arguments": "{}"}}
            for entry in two["tool_calls"]]}
        batches = [[_turn("b", "{}"), two], [user("next")], [both]]
        reports = _run(store, batches)[2]
        assert [appended for _, appended in reports] == [2, 1, 0]

    def test_per_turn_message_id_tells_a_copy(self, store: Store) -> None:
        batches = [[user("q"), _turn("1", "{}", "m1"), tool("1", "r1")],
                   [_turn("1", "{}", "m2"), tool("1", "r2")],  # another message: a new call
                   [_turn("1", "{}", "m2"), tool("1", "r3")]]  # a copy of m2, re-fired
        reports = _run(store, batches)[2]
        assert [appended for _, appended in reports] == [3, 2, 0]

    def test_per_turn_equals_strict_when_ids_are_unique(self, store: Store) -> None:
        batches = [[user("q"), _turn("a", "{}"), tool("a")], [_turn("b", "{}")],
                   [user("next")], [tool("b", "late")], [tool("a", "re-fired")]]
        _, model, _ = _run(store, batches)
        strict = ConversationBuffer()
        for batch in batches:
            strict.append(batch)
        assert model.messages == strict.messages

    def test_per_turn_window_evicts_a_declaration_with_its_result(self, store: Store) -> None:
        batches = [[user("q")]]
        for n in range(4):
            batches += [[_turn("1", f'{{"n": {n}}}'), tool("1", f"r{n}")]]
        _, model, _ = _run(store, batches, window=3)
        mine = caller_messages(model.messages)
        assert len(model.messages) <= 3 and mine[-1]["content"] == "r3"
