"""Property tests of the conversation buffer (MEM-1, 2, 3, 10, 11, 14 and the window).

Random but realistic operation sequences: user turns, assistant turns declaring
0-3 calls whose ids come from a SMALL pool (so collisions, re-fires and late
results happen all the time) in either spelling (MEM-11), top level or in
metadata; tool results (re-fired, late, marked healed, or with unusable ids);
system messages; and an optional ``max_messages`` window of 1-8.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given

from buffer_model import (
    SETTINGS,
    Msg,
    as_list,
    fold,
    raw_buffers,
    ref_append,
    results_per_id,
    sequences,
    show,
    tool_results,
    unanswered,
    usable_call_ids,
    windows,
)
from flowmem import HEALED_CONTENT, ConversationBuffer, append
from flowmem.ids import declared_call_ids, is_healed, result_id
from flowmem.messages import canonical_messages


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
