"""Property tests of the conversation buffer (MEM-1, 2, 3, 10, 11, 14 and the window).

Random but realistic operation sequences: user turns, assistant turns declaring
0-3 calls whose ids come from a SMALL pool (so collisions, re-fires and late
results happen all the time) in either spelling (MEM-11), top level or in
metadata; tool results (re-fired, late, marked healed, or with unusable ids);
system messages; and an optional ``max_messages`` window of 1-8.
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from flowmem import HEALED_CONTENT, ConversationBuffer, append, healed_placeholder
from flowmem.ids import declared_call_ids, is_healed, result_id
from flowmem.messages import canonical_messages

Msg = dict[str, Any]

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

# A small pool: "c1" and " c1 " are the same call, and so are 7 and "7" (MEM-11).
USABLE_IDS = ["c0", "c1", "c2", "c3", "c4", " c1 ", 7, "7"]
UNUSABLE_IDS: list[Any] = ["", "0", "  ", 0, None]

usable_call_ids = st.sampled_from(USABLE_IDS)
any_call_ids = st.sampled_from(USABLE_IDS * 3 + UNUSABLE_IDS)
texts = st.sampled_from(["", "hi", "find cats", "thinking", "Found 3 cats", "ok", " "])


@st.composite
def call_entries(draw: st.DrawFn) -> Msg:
    cid = draw(any_call_ids)
    if draw(st.booleans()):  # provider-flat spelling
        return {"id": cid, "type": "function",
                "function": {"name": "search", "arguments": "{}"}}
    return {"tool_call_id": cid, "name": "search"}


@st.composite
def assistant_turns(draw: st.DrawFn) -> Msg:
    calls = draw(st.lists(call_entries(), max_size=3))
    content = draw(st.one_of(texts, st.none()))
    message: Msg = {"role": "assistant", "content": content}
    if calls or draw(st.booleans()):
        if draw(st.booleans()):
            message["tool_calls"] = calls
        else:
            message["metadata"] = {"tool_calls": calls}
    return message


@st.composite
def tool_results(draw: st.DrawFn, ids: st.SearchStrategy[Any] = any_call_ids) -> Msg:
    cid = draw(ids)
    content = draw(texts)
    healed = draw(st.sampled_from([False, False, False, False, True]))
    fields: Msg = {"tool_call_id": cid}
    if healed:
        fields["healed"] = True
    if draw(st.booleans()):
        return {"role": "tool", "content": content, **fields}
    return {"role": "tool", "content": content, "metadata": fields}


def users() -> st.SearchStrategy[Msg]:
    return texts.map(lambda text: {"role": "user", "content": text})


def systems() -> st.SearchStrategy[Msg]:
    return texts.map(lambda text: {"role": "system", "content": text})


messages = st.one_of(users(), assistant_turns(), assistant_turns(), tool_results(),
                     tool_results(), systems())
# one append call: a single message, or a list of up to four
operations = st.one_of(messages, st.lists(messages, min_size=0, max_size=4))
sequences = st.lists(operations, min_size=1, max_size=14)
windows = st.one_of(st.none(), st.integers(min_value=1, max_value=8))


def _one_result_per_id(buffer: list[Msg]) -> bool:
    counts = Counter(cid for m in canonical_messages(buffer) if (cid := result_id(m)))
    return all(n == 1 for n in counts.values())


# A buffer that was NOT built through append (raw provider-flat or canonical
# turns). Duplicate results are left out: the window mishandles them (xfail
# tests in test_buffer_rules.py, section "a buffer handed in").
raw_buffers = st.lists(messages, max_size=6).filter(_one_result_per_id)


def show(**arguments: Any) -> None:
    """Print the arguments with a failing example (this environment's Hypothesis
    prints them blank in "Falsifying example")."""
    for name, value in arguments.items():
        note(f"{name} = {value!r}")


def as_list(operation: Any) -> list[Msg]:
    return [operation] if isinstance(operation, dict) else list(operation)


def fold(buffer: list[Msg], ops: list[Any], max_messages: int | None) -> list[Any]:
    """The results of folding the pure :func:`flowmem.append` over ``ops``."""
    results = []
    for op in ops:
        result = append(buffer, op, max_messages=max_messages)
        results.append(result)
        buffer = result.messages
    return results


# --------------------------------------------------------------------------- a reference model
# A naive, O(n)-per-message reading of the spec, written independently of
# flowmem.plan and flowmem.buffer (ids are read through flowmem.ids, the one id
# reader MEM-11 requires).


def _ref_heal(buf: list[Msg]) -> None:
    answered = {result_id(m) for m in buf} - {None}
    first: dict[str, tuple[int, int]] = {}
    for index, message in enumerate(buf):
        for order, cid in enumerate(declared_call_ids(message)):
            if cid not in answered and cid not in first:
                first[cid] = (index, order)
    by_turn: dict[int, list[tuple[int, str]]] = {}
    for cid, (index, order) in first.items():
        by_turn.setdefault(index, []).append((order, cid))
    for index in sorted(by_turn, reverse=True):
        end = index
        while end + 1 < len(buf) and buf[end + 1]["role"] == "tool":
            end += 1
        buf[end + 1:end + 1] = [healed_placeholder(cid) for _, cid in sorted(by_turn[index])]


def ref_append(buffer: list[Msg], incoming: Any,
               max_messages: int | None) -> tuple[list[Msg], int]:
    buf = copy.deepcopy(buffer)
    appended = 0
    for message in canonical_messages(incoming):
        role = message["role"]
        if role == "tool":
            cid = result_id(message)
            holders = [i for i, m in enumerate(buf) if cid is not None and result_id(m) == cid]
            if not holders:
                buf.append(message)
                appended += 1
            elif is_healed(buf[holders[0]]) and not is_healed(message):
                buf[holders[0]] = message  # MEM-10
            continue  # MEM-1
        if role == "assistant":
            ids = declared_call_ids(message)
            declared = {cid for m in buf for cid in declared_call_ids(m)}
            if ids and all(cid in declared for cid in ids):
                continue  # MEM-2
        elif role == "user":
            _ref_heal(buf)  # MEM-3
        buf.append(message)
        appended += 1
    if max_messages is not None and len(buf) > max_messages:
        victims, buf = buf[:len(buf) - max_messages], buf[len(buf) - max_messages:]
        kept = {cid for m in buf for cid in declared_call_ids(m)}
        dead = {cid for m in victims for cid in declared_call_ids(m)} - kept
        buf = [m for m in buf if result_id(m) is None or result_id(m) not in dead]
    return buf, appended


# --------------------------------------------------------------------------- invariants


def unanswered(buf: list[Msg]) -> set[str]:
    declared = {cid for m in buf for cid in declared_call_ids(m)}
    answered = {result_id(m) for m in buf}
    return declared - answered


def results_per_id(buf: list[Msg]) -> Counter[str]:
    return Counter(cid for m in buf if (cid := result_id(m)) is not None)


# --------------------------------------------------------------------------- properties


@SETTINGS
@given(buffer=raw_buffers, ops=sequences, max_messages=windows)
def test_append_never_mutates_its_inputs(buffer: list[Msg], ops: list[Any],
                                         max_messages: int | None) -> None:
    show(buffer=buffer, ops=ops, max_messages=max_messages)
    for op in ops:
        buffer_before, op_before = copy.deepcopy(buffer), copy.deepcopy(op)
        result = append(buffer, op, max_messages=max_messages)
        assert buffer == buffer_before
        assert op == op_before
        # the result shares nothing with the inputs either
        for message in result.messages:
            message["metadata"]["mutated"] = True
            if isinstance(message["content"], list | dict):
                message["content"] = "mutated"
        assert buffer == buffer_before
        assert op == op_before
        buffer = append(buffer, op, max_messages=max_messages).messages


@SETTINGS
@given(buffer=raw_buffers, ops=sequences, max_messages=windows)
def test_conversation_buffer_equals_folding_append(buffer: list[Msg], ops: list[Any],
                                                   max_messages: int | None) -> None:
    show(buffer=buffer, ops=ops, max_messages=max_messages)
    stateful = ConversationBuffer(buffer, max_messages=max_messages)
    for op, expected in zip(ops, fold(buffer, ops, max_messages), strict=True):
        got = stateful.append(op)
        assert got.messages == expected.messages
        assert got.count == expected.count
        assert got.appended == expected.appended
        assert stateful.messages == expected.messages
        assert len(stateful) == expected.count


@SETTINGS
@given(buffer=raw_buffers, ops=sequences, max_messages=windows)
def test_append_agrees_with_a_naive_reference_model(buffer: list[Msg], ops: list[Any],
                                                    max_messages: int | None) -> None:
    show(buffer=buffer, ops=ops, max_messages=max_messages)
    reference: list[Msg] = canonical_messages(buffer)
    for op, result in zip(ops, fold(buffer, ops, max_messages), strict=True):
        reference, appended = ref_append(reference, op, max_messages)
        assert result.messages == reference
        assert result.appended == appended
        assert result.count == len(reference)


@SETTINGS
@given(ops=sequences, max_messages=windows, refire=tool_results(ids=usable_call_ids))
def test_mem1_appending_the_same_tool_result_twice_equals_once(
        ops: list[Any], max_messages: int | None, refire: Msg) -> None:
    show(ops=ops, max_messages=max_messages, refire=refire)
    results = fold([], ops, max_messages)
    buffer = results[-1].messages
    once = append(buffer, refire, max_messages=max_messages)
    twice_in_one = append(buffer, [refire, copy.deepcopy(refire)], max_messages=max_messages)
    assert twice_in_one.messages == once.messages
    assert twice_in_one.appended == once.appended
    cid = result_id(canonical_messages(refire)[0])
    if cid in results_per_id(once.messages):  # not evicted by the window meanwhile
        again = append(once.messages, refire, max_messages=max_messages)
        assert again.messages == once.messages
        assert again.to_dict() == {"count": once.count, "appended": 0, "appended_any": False}


@SETTINGS
@given(buffer=raw_buffers, ops=sequences, max_messages=windows)
def test_mem14_count_is_the_length_and_respects_the_window(buffer: list[Msg], ops: list[Any],
                                                     max_messages: int | None) -> None:
    show(buffer=buffer, ops=ops, max_messages=max_messages)
    stateful = ConversationBuffer(buffer, max_messages=max_messages)
    for op in ops:
        result = stateful.append(op)
        assert result.count == len(result.messages) == len(stateful)
        assert 0 <= result.appended <= len(as_list(op))
        assert result.appended_any is (result.appended > 0)
        if max_messages is not None:
            assert result.count <= max_messages


@SETTINGS
@given(buffer=raw_buffers, ops=sequences)
def test_mem3_no_unanswered_call_after_a_user_message(buffer: list[Msg], ops: list[Any]) -> None:
    # Unwindowed: with a window, eviction runs after healing and may remove a
    # result that sat BEFORE a still-declared turn (see test_buffer_rules).
    show(buffer=buffer, ops=ops)
    for op, result in zip(ops, fold(buffer, ops, None), strict=True):
        incoming = as_list(op)
        if incoming and incoming[-1]["role"] == "user":  # nothing declared after it
            assert unanswered(result.messages) == set()


@SETTINGS
@given(ops=sequences, max_messages=windows)
def test_mem1_mem10_no_id_has_two_results_in_a_buffer_built_through_append(
        ops: list[Any], max_messages: int | None) -> None:
    show(ops=ops, max_messages=max_messages)
    stateful = ConversationBuffer(max_messages=max_messages)
    for op in ops:
        result = stateful.append(op)
        counts = results_per_id(result.messages)
        assert all(n == 1 for n in counts.values()), counts


@SETTINGS
@given(ops=sequences, max_messages=windows)
def test_mem3_placeholders_sit_right_after_a_turn_declaring_their_id(
        ops: list[Any], max_messages: int | None) -> None:
    # A placeholder the buffer wrote (the generated healed messages never carry
    # HEALED_CONTENT) is never last, and only tool messages separate it from an
    # assistant turn declaring its id; with a window that turn may be gone, but
    # then so is everything before the placeholder.
    show(ops=ops, max_messages=max_messages)
    for result in fold([], ops, max_messages):
        buf = result.messages
        for index, message in enumerate(buf):
            if message["content"] != HEALED_CONTENT or not is_healed(message):
                continue
            assert index < len(buf) - 1
            j = index - 1
            while j >= 0 and buf[j]["role"] == "tool":
                j -= 1
            if j < 0:
                assert max_messages is not None
            else:
                assert buf[j]["role"] == "assistant"
                assert result_id(message) in declared_call_ids(buf[j])
