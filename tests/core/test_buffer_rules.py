"""The conversation buffer's append rules, one section per GR-MEM rule.

MEM-1 (idempotent tool results), MEM-2 (assistant duplicates), MEM-3 (healing
at the user boundary), MEM-10 (the real result replaces the placeholder),
MEM-11 (both id spellings), MEM-14 (the append reports its delta) and the
``max_messages`` window.

Every rule test runs twice: through the pure :func:`flowmem.append` (folded
call by call) and through the stateful :class:`flowmem.ConversationBuffer`,
which keeps incremental indexes; both must behave exactly alike.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import pytest

import flowmem
from flowmem import (
    HEALED_CONTENT,
    AppendResult,
    ConversationBuffer,
    FlowmemError,
    InvalidInput,
    append,
    healed_placeholder,
)
from flowmem.ids import call_id, declared_call_ids, is_healed, result_id, usable_id

Msg = dict[str, Any]


# --------------------------------------------------------------------------- helpers
# The helpers build messages in the canonical stored shape, so expected buffers
# compare with ``==`` directly.


def U(text: str = "hi") -> Msg:
    return {"role": "user", "content": text, "metadata": {}}


def S(text: str = "be brief") -> Msg:
    return {"role": "system", "content": text, "metadata": {}}


def A(*ids: Any, content: Any = "", key: str = "tool_call_id") -> Msg:
    """An assistant turn declaring ``ids`` (no ``tool_calls`` at all when none)."""
    metadata: Msg = {}
    if ids:
        metadata["tool_calls"] = [{key: i, "name": "search"} for i in ids]
    return {"role": "assistant", "content": content, "metadata": metadata}


def T(cid: Any, content: Any = "ok", **extra: Any) -> Msg:
    return {"role": "tool", "content": content, "metadata": {"tool_call_id": cid, **extra}}


def P(cid: str) -> Msg:
    """The healed placeholder the buffer writes for ``cid`` (MEM-3)."""
    return {"role": "tool", "content": HEALED_CONTENT,
            "metadata": {"tool_call_id": cid, "healed": True}}


class PureRunner:
    """Folds :func:`flowmem.append`, feeding each result's messages to the next call."""

    def __init__(self, messages: Sequence[Any] = (), *, max_messages: int | None = None) -> None:
        self.messages: list[Msg] = list(messages)
        self.max_messages = max_messages

    def append(self, incoming: Any) -> AppendResult:
        result = append(self.messages, incoming, max_messages=self.max_messages)
        self.messages = result.messages
        return result


class StatefulRunner:
    """Drives one :class:`flowmem.ConversationBuffer`."""

    def __init__(self, messages: Sequence[Any] = (), *, max_messages: int | None = None) -> None:
        self.buffer = ConversationBuffer(messages, max_messages=max_messages)

    def append(self, incoming: Any) -> AppendResult:
        return self.buffer.append(incoming)

    @property
    def messages(self) -> list[Msg]:
        return self.buffer.messages


Runner = PureRunner | StatefulRunner


@pytest.fixture(params=[PureRunner, StatefulRunner], ids=["append", "ConversationBuffer"])
def make(request: pytest.FixtureRequest) -> type[Runner]:
    runner: type[Runner] = request.param
    return runner


def report(result: AppendResult) -> tuple[int, int, bool]:
    return result.count, result.appended, result.appended_any


# =========================================================================== MEM-1


def test_mem1_refired_tool_result_is_dropped(make: type[Runner]) -> None:
    buf = make([U(), A("c1"), T("c1", "first")])
    result = buf.append(T("c1", "second"))
    assert result.messages == [U(), A("c1"), T("c1", "first")]
    assert report(result) == (3, 0, False)


def test_mem1_refired_result_in_the_same_append_is_dropped(make: type[Runner]) -> None:
    buf = make()
    result = buf.append([A("c1"), T("c1", "a"), T("c1", "b"), T("c1", "a")])
    assert result.messages == [A("c1"), T("c1", "a")]
    assert report(result) == (2, 2, True)


def test_mem1_result_for_an_undeclared_id_is_appended_then_deduplicated(
        make: type[Runner]) -> None:
    buf = make([U()])
    first = buf.append(T("orphan", "x"))
    assert report(first) == (2, 1, True)
    second = buf.append(T("orphan", "y"))
    assert report(second) == (2, 0, False)
    assert second.messages == [U(), T("orphan", "x")]


def test_mem1_count_is_the_deduplicated_size(make: type[Runner]) -> None:
    buf = make([A("c1", "c2")])
    result = buf.append([T("c1"), T("c2"), T("c1"), T("c2"), T("c1")])
    assert result.count == 3 == len(result.messages)
    assert result.appended == 2


@pytest.mark.parametrize("bad_id", [None, "", "   ", "0", " 0 ", 0, True, False, 1.5, [], {}],
                         ids=repr)
def test_mem1_tool_message_without_usable_id_is_appended_as_is(
        make: type[Runner], bad_id: Any) -> None:
    message = {"role": "tool", "content": "r", "metadata": {"tool_call_id": bad_id}}
    buf = make([U(), A("c1")])
    first = buf.append(message)
    second = buf.append(copy.deepcopy(message))
    assert report(first) == (3, 1, True)
    assert report(second) == (4, 1, True)
    assert second.messages[2:] == [message, message]


def test_mem1_tool_message_with_no_id_field_is_appended_as_is(make: type[Runner]) -> None:
    message = {"role": "tool", "content": "r", "metadata": {}}
    buf = make()
    buf.append(message)
    result = buf.append(message)
    assert result.messages == [message, message]
    assert result.appended == 1


def test_mem1_result_held_by_real_entry_is_dropped_even_if_declared_again(
        make: type[Runner]) -> None:
    buf = make([A("c1"), T("c1", "one"), U("next")])
    result = buf.append([A("c1", "c2"), T("c1", "two"), T("c2", "three")])
    assert result.messages == [A("c1"), T("c1", "one"), U("next"), A("c1", "c2"),
                               T("c2", "three")]
    assert result.appended == 2


# =========================================================================== MEM-2


def test_mem2_assistant_turn_dropped_when_every_declared_id_is_declared(
        make: type[Runner]) -> None:
    buf = make([A("c1", "c2"), T("c1"), T("c2")])
    result = buf.append(A("c2", "c1", content="again"))
    assert result.messages == [A("c1", "c2"), T("c1"), T("c2")]
    assert report(result) == (3, 0, False)


def test_mem2_subset_of_declared_ids_is_dropped(make: type[Runner]) -> None:
    buf = make([A("c1", "c2", "c3")])
    assert buf.append(A("c2")).appended == 0
    assert buf.append(A("c3", "c1")).appended == 0
    assert buf.messages == [A("c1", "c2", "c3")]


def test_mem2_one_new_id_keeps_the_whole_turn(make: type[Runner]) -> None:
    buf = make([A("c1", "c2"), T("c1"), T("c2")])
    turn = A("c1", "c2", "c3", content="one more")
    result = buf.append(turn)
    assert report(result) == (4, 1, True)
    assert result.messages[-1] == turn  # kept whole, all three calls intact


def test_mem2_declared_earlier_in_the_same_append(make: type[Runner]) -> None:
    buf = make([U()])
    result = buf.append([A("c1", content="x"), A("c1", content="y"), T("c1"),
                         A("c1", content="z")])
    assert result.messages == [U(), A("c1", content="x"), T("c1")]
    assert result.appended == 2


def test_mem2_declared_earlier_in_the_same_append_one_new_id_kept(make: type[Runner]) -> None:
    buf = make()
    result = buf.append([A("c1"), A("c1", "c2")])
    assert result.messages == [A("c1"), A("c1", "c2")]
    assert result.appended == 2


def test_mem2_turn_without_calls_is_never_dropped(make: type[Runner]) -> None:
    buf = make()
    turn = A(content="same words")
    buf.append(turn)
    buf.append(turn)
    result = buf.append([turn, turn])
    assert result.messages == [turn] * 4
    assert report(result) == (4, 2, True)


@pytest.mark.parametrize("calls", [
    [],
    [{"id": "0"}],
    [{"tool_call_id": ""}, {"id": "   "}],
    [{"id": None}, {"tool_call_id": 0}, {"id": True}],
    [{"name": "search"}],
], ids=repr)
def test_mem2_turn_with_only_unusable_ids_is_never_dropped(
        make: type[Runner], calls: list[Msg]) -> None:
    turn = {"role": "assistant", "content": "", "metadata": {"tool_calls": calls}}
    buf = make([turn])
    result = buf.append([turn, turn])
    assert result.messages == [turn] * 3
    assert result.appended == 2


def test_mem2_an_answered_but_undeclared_id_does_not_count_as_declared(
        make: type[Runner]) -> None:
    # the orphan result answers c1 but no turn declares it
    buf = make([T("c1")])
    result = buf.append(A("c1"))
    assert result.messages == [T("c1"), A("c1")]
    assert result.appended == 1


def test_mem2_dropped_turn_adds_no_declaration_and_does_not_heal(make: type[Runner]) -> None:
    buf = make([A("c1"), T("c1")])
    result = buf.append([A("c1", content="dup"), U()])
    assert result.messages == [A("c1"), T("c1"), U()]
    assert result.appended == 1


# =========================================================================== MEM-3


def test_mem3_user_message_heals_an_unanswered_call(make: type[Runner]) -> None:
    buf = make([U("find cats"), A("c1")])
    result = buf.append(U("well?"))
    assert result.messages == [U("find cats"), A("c1"), P("c1"), U("well?")]
    assert report(result) == (4, 1, True)  # the placeholder never counts


def test_mem3_placeholders_follow_the_result_block_in_declaration_order(
        make: type[Runner]) -> None:
    buf = make([A("c1", "c2", "c3", "c4"), T("c3", "three")])
    result = buf.append(U())
    assert result.messages == [A("c1", "c2", "c3", "c4"), T("c3", "three"),
                               P("c1"), P("c2"), P("c4"), U()]
    assert result.appended == 1


def test_mem3_placeholders_go_after_their_turn_not_at_the_end(make: type[Runner]) -> None:
    # a buffer not built through append: two old turns were never healed
    buf = make([U("q1"), A("a1"), S("note"), A("b1", "b2"), T("b2"), U("q2"), A(content="hm")])
    result = buf.append(U("q3"))
    assert result.messages == [
        U("q1"), A("a1"), P("a1"), S("note"), A("b1", "b2"), T("b2"), P("b1"), U("q2"),
        A(content="hm"), U("q3"),
    ]
    assert report(result) == (10, 1, True)


def test_mem3_heals_turns_added_earlier_in_the_same_append(make: type[Runner]) -> None:
    buf = make()
    result = buf.append([U("q"), A("c1", "c2"), T("c2"), U("again")])
    assert result.messages == [U("q"), A("c1", "c2"), T("c2"), P("c1"), U("again")]
    assert report(result) == (5, 4, True)


@pytest.mark.parametrize("incoming", [
    S("system"),
    A("c2"),
    A(content="no calls"),
    T("c9"),
    T("c2"),
    {"role": "tool", "content": "no id", "metadata": {}},
], ids=["system", "assistant-with-call", "assistant", "orphan-tool", "other-tool", "tool-no-id"])
def test_mem3_non_user_appends_never_heal(make: type[Runner], incoming: Msg) -> None:
    buf = make([U(), A("c1")])
    result = buf.append(incoming)
    assert not any(is_healed(m) for m in result.messages)
    assert result.messages == [U(), A("c1"), incoming]
    assert report(result) == (3, 1, True)


def test_mem3_answered_calls_are_not_healed_even_when_the_result_is_not_adjacent(
        make: type[Runner]) -> None:
    buf = make([A("c1"), S("in between"), T("c1")])
    result = buf.append(U())
    assert result.messages == [A("c1"), S("in between"), T("c1"), U()]


def test_mem3_calls_with_unusable_ids_are_not_healed(make: type[Runner]) -> None:
    turn = {"role": "assistant", "content": "",
            "metadata": {"tool_calls": [{"id": "0"}, {"tool_call_id": " "}, {"id": None}]}}
    buf = make([turn])
    result = buf.append(U())
    assert result.messages == [turn, U()]


def test_mem3_call_declared_twice_is_healed_after_its_first_declaring_turn(
        make: type[Runner]) -> None:
    buf = make()
    result = buf.append([A("c1"), A("c1", "c2"), U()])
    assert result.messages == [A("c1"), P("c1"), A("c1", "c2"), P("c2"), U()]
    assert result.appended == 3


def test_mem3_healing_happens_once(make: type[Runner]) -> None:
    buf = make([A("c1")])
    buf.append(U("one"))
    result = buf.append([U("two"), U("three")])
    assert result.messages == [A("c1"), P("c1"), U("one"), U("two"), U("three")]
    assert result.appended == 2


def test_mem3_a_second_heal_of_the_same_turn_goes_after_the_first_placeholders(
        make: type[Runner]) -> None:
    # c1 is healed first; a later turn re-declares c1 with a new c2 (MEM-2 keeps it)
    buf = make([A("c1"), U("one")])
    result = buf.append([A("c1", "c2"), U("two")])
    assert result.messages == [A("c1"), P("c1"), U("one"), A("c1", "c2"), P("c2"), U("two")]


def test_mem3_healed_placeholder_shape() -> None:
    assert healed_placeholder("c7") == P("c7")
    assert HEALED_CONTENT == "Tool call was interrupted; no result."
    first, second = healed_placeholder("x"), healed_placeholder("x")
    first["metadata"]["healed"] = False
    assert second == P("x")  # a fresh dict each time


# =========================================================================== MEM-10

SEED_PLACEHOLDER: Msg = {"role": "tool", "content": "Tool call was interrupted; no result.",
                         "metadata": {"tool_call_id": "c1", "healed": True}}
SEED_REPLACED: Msg = {"role": "tool", "content": "Found 3 cats",
                      "metadata": {"tool_call_id": "c1"}}


def test_mem10_seed_example_real_result_replaces_the_placeholder_in_place(
        make: type[Runner]) -> None:
    before = [U("find cats"), A("c1"), copy.deepcopy(SEED_PLACEHOLDER), U("any luck?")]
    buf = make(before)
    result = buf.append(copy.deepcopy(SEED_REPLACED))
    assert result.messages == [U("find cats"), A("c1"), SEED_REPLACED, U("any luck?")]
    assert result.messages[2] == SEED_REPLACED  # the healed marking went with it
    assert "healed" not in result.messages[2]["metadata"]
    assert result.count == len(before)  # the buffer is no longer than it was
    assert report(result) == (4, 0, False)  # a replacement is reported as none


def test_mem10_second_real_result_is_then_deduplicated(make: type[Runner]) -> None:
    buf = make([U("find cats"), A("c1"), copy.deepcopy(SEED_PLACEHOLDER), U("any luck?")])
    buf.append(copy.deepcopy(SEED_REPLACED))
    result = buf.append({"role": "tool", "content": "Found 4 cats",
                         "metadata": {"tool_call_id": "c1"}})
    assert result.messages == [U("find cats"), A("c1"), SEED_REPLACED, U("any luck?")]
    assert report(result) == (4, 0, False)


def test_mem10_replaces_a_placeholder_the_buffer_healed_itself(make: type[Runner]) -> None:
    buf = make([U("q"), A("c1", "c2"), T("c2", "two")])
    buf.append(U("hello?"))
    result = buf.append(T("c1", "one"))
    assert result.messages == [U("q"), A("c1", "c2"), T("c2", "two"), T("c1", "one"),
                               U("hello?")]
    assert report(result) == (5, 0, False)


def test_mem10_replacement_in_the_same_append_as_the_heal(make: type[Runner]) -> None:
    buf = make([A("c1")])
    result = buf.append([U("late"), T("c1", "real")])
    assert result.messages == [A("c1"), T("c1", "real"), U("late")]
    assert report(result) == (3, 1, True)  # only the user message is new


def test_mem10_incoming_healed_message_never_replaces_a_placeholder(
        make: type[Runner]) -> None:
    buf = make([A("c1"), P("c1"), U()])
    result = buf.append(T("c1", "other guess", healed=True))
    assert result.messages == [A("c1"), P("c1"), U()]
    assert report(result) == (3, 0, False)


def test_mem10_incoming_healed_message_never_replaces_a_real_result(
        make: type[Runner]) -> None:
    buf = make([A("c1"), T("c1", "real")])
    result = buf.append(P("c1"))
    assert result.messages == [A("c1"), T("c1", "real")]
    assert report(result) == (2, 0, False)


def test_mem10_incoming_healed_message_with_a_new_id_is_appended_as_is(
        make: type[Runner]) -> None:
    incoming = T("c1", "custom text", healed=True, extra="kept")
    buf = make([A("c1")])
    result = buf.append(incoming)
    assert result.messages == [A("c1"), incoming]
    assert report(result) == (2, 1, True)
    # it now holds the id as a placeholder: a real result replaces it in place
    replaced = buf.append(T("c1", "real"))
    assert replaced.messages == [A("c1"), T("c1", "real")]
    assert replaced.appended == 0


def test_mem10_placeholder_marking_read_at_the_top_level_of_a_flat_buffer(
        make: type[Runner]) -> None:
    flat = [{"role": "assistant", "content": None,
             "tool_calls": [{"id": "c1", "type": "function",
                             "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "content": HEALED_CONTENT, "tool_call_id": "c1", "healed": True}]
    buf = make(flat)
    result = buf.append({"role": "tool", "content": "real", "tool_call_id": "c1"})
    assert result.messages[1] == T("c1", "real")
    assert report(result) == (2, 0, False)


# =========================================================================== MEM-11

SEED_FLAT_TURN: Msg = {"role": "assistant", "content": "",
                       "metadata": {"tool_calls": [{"id": "call_1", "name": "search"}]}}


def test_mem11_seed_example_flat_id_is_healed_as_tool_call_id(make: type[Runner]) -> None:
    buf = make([U("search for it"), copy.deepcopy(SEED_FLAT_TURN)])
    result = buf.append(U("and?"))
    assert result.messages[1] == SEED_FLAT_TURN  # the declaring turn is kept intact
    placeholder = result.messages[2]
    assert placeholder["role"] == "tool"
    assert placeholder["metadata"] == {"tool_call_id": "call_1", "healed": True}
    assert placeholder == P("call_1")
    assert result.messages[3] == U("and?")


def test_mem11_flat_id_in_openai_top_level_tool_calls_is_healed(make: type[Runner]) -> None:
    turn = {"role": "assistant", "content": None,
            "tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": "search", "arguments": "{\"q\":\"x\"}"}}]}
    buf = make([turn])
    result = buf.append(U())
    assert result.messages[1:] == [P("call_1"), U()]


def test_mem11_both_spellings_dedup_against_each_other_for_assistant_turns(
        make: type[Runner]) -> None:
    buf = make([A("c1", key="id")])
    assert buf.append(A("c1", key="tool_call_id")).appended == 0
    buf2 = make([A("c1", key="tool_call_id")])
    assert buf2.append(A("c1", key="id")).appended == 0
    mixed = {"role": "assistant", "content": "",
             "metadata": {"tool_calls": [{"id": "c1"}, {"tool_call_id": "c2"}]}}
    assert make([A("c2", "c1")]).append(mixed).appended == 0


def test_mem11_result_answers_a_flat_spelled_call(make: type[Runner]) -> None:
    buf = make([A("c1", key="id"), T("c1")])
    result = buf.append(U())
    assert result.messages == [A("c1", key="id"), T("c1"), U()]


def test_mem11_result_ids_at_top_level_and_in_metadata_dedup(make: type[Runner]) -> None:
    buf = make([A("c1")])
    first = buf.append({"role": "tool", "content": "top", "tool_call_id": "c1"})
    assert first.messages[-1] == T("c1", "top")
    assert buf.append(T("c1", "meta")).appended == 0
    assert buf.append({"role": "tool", "content": "top", "tool_call_id": "c1"}).appended == 0


def test_mem11_declared_calls_at_top_level_and_in_metadata_dedup(make: type[Runner]) -> None:
    buf = make([{"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]}])
    assert buf.append(A("c1")).appended == 0


def test_mem11_int_ids_are_cast(make: type[Runner]) -> None:
    buf = make([A(7, key="id")])
    healed = buf.append(U())
    assert healed.messages[1] == P("7")
    replaced = buf.append({"role": "tool", "content": "seven", "tool_call_id": 7})
    assert replaced.messages[1] == T("7", "seven")  # stored under the string id
    assert replaced.appended == 0
    assert buf.append(T("7", "again")).appended == 0
    assert buf.append(A("7")).appended == 0  # declared 7 and "7" are the same call


def test_mem11_ids_are_trimmed(make: type[Runner]) -> None:
    buf = make([A(" c1 ")])
    assert buf.append(A("c1")).appended == 0
    result = buf.append(T("  c1\t", "r"))
    assert result.messages[-1] == T("c1", "r")
    assert buf.append(T("c1")).appended == 0


def test_mem11_unusable_normalized_spelling_falls_back_to_flat_id(make: type[Runner]) -> None:
    turn = {"role": "assistant", "content": "",
            "metadata": {"tool_calls": [{"tool_call_id": "", "id": "c1"}]}}
    buf = make([turn])
    assert buf.append(U()).messages[1] == P("c1")


def test_mem11_unusable_top_level_result_id_does_not_hide_the_metadata_one(
        make: type[Runner]) -> None:
    buf = make([A("c1"), T("c1", "real")])
    result = buf.append({"role": "tool", "content": "dup", "tool_call_id": "",
                         "metadata": {"tool_call_id": "c1"}})
    assert report(result) == (2, 0, False)  # MEM-1: a re-fire of c1


def test_mem11_normalized_spelling_is_read_first() -> None:
    entry = {"tool_call_id": "norm", "id": "flat"}
    assert call_id(entry) == "norm"
    assert call_id({"id": "flat"}) == "flat"
    assert call_id({"tool_call_id": " x "}) == "x"
    assert call_id("c1") is None


def test_mem11_one_reader_for_declared_ids_and_result_ids() -> None:
    top = {"role": "assistant", "tool_calls": [{"id": "a"}, {"tool_call_id": "b"}, {"id": "a"},
                                               {"id": "0"}, {"id": 3}]}
    meta = {"role": "assistant", "metadata": {"tool_calls": [{"id": "a"}]}}
    assert declared_call_ids(top) == ["a", "b", "3"]
    assert declared_call_ids(meta) == ["a"]
    assert declared_call_ids({"role": "user", "tool_calls": [{"id": "a"}]}) == []
    assert result_id({"role": "tool", "tool_call_id": 5}) == "5"
    assert result_id({"role": "tool", "metadata": {"tool_call_id": " r "}}) == "r"
    assert result_id({"role": "user", "tool_call_id": "r"}) is None
    assert result_id({"role": "tool", "tool_call_id": "0"}) is None


@pytest.mark.parametrize(("value", "expected"), [
    ("c1", "c1"), (" c1 ", "c1"), (12, "12"), (-3, "-3"), ("00", "00"),
    ("0", None), (" 0 ", None), (0, None), ("", None), ("  \t", None), (None, None),
    (True, None), (False, None), (1.0, None), ([], None), ({}, None), (b"c1", None),
], ids=repr)
def test_mem11_usable_id(value: Any, expected: str | None) -> None:
    assert usable_id(value) == expected
    assert flowmem.usable_id is usable_id


# =========================================================================== MEM-14


def test_mem14_seed_example_new_message_at_a_full_window(make: type[Runner]) -> None:
    buf = make([U("one"), A(content="two"), U("three")], max_messages=3)
    result = buf.append(A(content="four"))
    assert result.to_dict() == {"count": 3, "appended": 1, "appended_any": True}
    assert result.messages == [A(content="two"), U("three"), A(content="four")]


def test_mem14_seed_example_refired_result_reports_nothing(make: type[Runner]) -> None:
    buf = make([A("c1"), T("c1")])
    result = buf.append(T("c1"))
    assert result.to_dict() == {"count": 2, "appended": 0, "appended_any": False}


def test_mem14_to_dict_has_exactly_the_report_keys(make: type[Runner]) -> None:
    result = make().append(U())
    report_dict = result.to_dict()
    assert list(report_dict) == ["count", "appended", "appended_any"]
    assert type(report_dict["appended_any"]) is bool
    assert type(report_dict["count"]) is int
    assert type(report_dict["appended"]) is int


def test_mem14_mixed_append_counts_only_new_entries(make: type[Runner]) -> None:
    buf = make([A("c1", "c2"), T("c1"), P("c2")])
    result = buf.append([T("c1", "dup"), T("c2", "replaces"), A("c1"), U("new"),
                         A("c3", content="new"), T("c3", "new")])
    assert report(result) == (6, 3, True)
    assert result.messages == [A("c1", "c2"), T("c1"), T("c2", "replaces"), U("new"),
                               A("c3", content="new"), T("c3", "new")]


def test_mem14_empty_append_reports_zero(make: type[Runner]) -> None:
    buf = make([U()])
    assert report(buf.append([])) == (1, 0, False)


def test_mem14_appended_any_follows_appended() -> None:
    assert AppendResult(count=5, appended=0, messages=[]).appended_any is False
    assert AppendResult(count=5, appended=2, messages=[]).appended_any is True


def test_mem14_stateful_result_messages_match_the_buffer() -> None:
    buf = ConversationBuffer()
    result = buf.append([U(), A("c1"), T("c1")])
    assert result.messages == buf.messages == list(buf)
    assert result.count == len(buf) == 3


def test_mem14_stateful_result_messages_are_the_buffer_after_that_append() -> None:
    buf = ConversationBuffer()
    first = buf.append(U("a"))
    buf.append(U("b"))
    assert first.count == len(first.messages) == 1


# =========================================================================== window


def test_window_evicts_oldest_first_including_system_messages(make: type[Runner]) -> None:
    buf = make([S("prompt"), U("one"), A(content="two")], max_messages=3)
    result = buf.append(U("three"))
    assert result.messages == [U("one"), A(content="two"), U("three")]
    assert report(result) == (3, 1, True)


def test_window_evicts_once_at_the_end_of_the_append(make: type[Runner]) -> None:
    buf = make([U("old")], max_messages=2)
    result = buf.append([U("a"), U("b"), U("c"), U("d")])
    assert result.messages == [U("c"), U("d")]
    assert report(result) == (2, 4, True)  # added-then-evicted still counts


def test_window_added_then_evicted_still_counts(make: type[Runner]) -> None:
    buf = make(max_messages=1)
    result = buf.append([U("a"), S("b"), U("c")])
    assert result.messages == [U("c")]
    assert report(result) == (1, 3, True)


def test_window_evicting_a_turn_evicts_its_results_even_when_they_sit_later(
        make: type[Runner]) -> None:
    buf = make([A("c1"), A("c2"), T("c2"), T("c1")], max_messages=4)
    result = buf.append(S("note"))
    assert result.messages == [A("c2"), T("c2"), S("note")]
    assert report(result) == (3, 1, True)  # fewer than max_messages


def test_window_evicting_a_turn_evicts_its_placeholder(make: type[Runner]) -> None:
    buf = make(max_messages=2)
    result = buf.append([A("c1"), U("q")])
    # A(c1), P(c1), U(q) -> the turn goes, and its placeholder with it
    assert result.messages == [U("q")]
    assert report(result) == (1, 2, True)


def test_window_result_survives_while_another_turn_still_declares_its_id(
        make: type[Runner]) -> None:
    buf = make([A("c1"), A("c1", "c2"), T("c1"), T("c2")], max_messages=4)
    result = buf.append(U())
    assert result.messages == [A("c1", "c2"), T("c1"), T("c2"), U()]


def test_window_evicted_declarations_no_longer_count_for_mem2(make: type[Runner]) -> None:
    buf = make([A("c1"), T("c1"), U()], max_messages=3)
    buf.append(U("next"))  # A(c1) goes, and T(c1) with it
    result = buf.append(A("c1"))
    assert result.messages == [U(), U("next"), A("c1")]
    assert result.appended == 1


def test_window_evicted_results_no_longer_count_for_mem1(make: type[Runner]) -> None:
    buf = make([T("c1", "orphan"), U()], max_messages=2)
    buf.append(U("next"))
    result = buf.append(T("c1", "again"))
    assert result.messages == [U("next"), T("c1", "again")]
    assert result.appended == 1


def test_window_call_whose_earlier_result_is_evicted_is_unanswered_again(
        make: type[Runner]) -> None:
    # the result was appended before the turn declaring its id (an orphan then)
    buf = make([T("c1", "early"), S("a"), S("b"), A("c1")], max_messages=4)
    first = buf.append(S("c"))  # evicts T(c1): c1 is declared and unanswered again
    assert first.messages == [S("a"), S("b"), A("c1"), S("c")]
    second = buf.append(U())  # heals c1 right after its turn, then evicts S(a), S(b)
    assert second.messages == [A("c1"), P("c1"), S("c"), U()]
    assert report(second) == (4, 1, True)


def test_window_buffer_longer_than_the_window_is_cut_at_the_next_append(
        make: type[Runner]) -> None:
    buf = make([U("1"), U("2"), U("3"), U("4")], max_messages=2)
    result = buf.append([])
    assert result.messages == [U("3"), U("4")]
    assert report(result) == (2, 0, False)


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_window_count_never_exceeds_max_messages(make: type[Runner], size: int) -> None:
    buf = make(max_messages=size)
    for i in range(12):
        result = buf.append([U(f"q{i}"), A(f"c{i}"), T(f"c{i}"), A(content=f"a{i}")])
        assert result.count <= size
        assert result.count == len(result.messages)
        assert result.appended == 4


@pytest.mark.parametrize("bad", [0, -1, True, False, "3", 1.5, 3.0, [3]], ids=repr)
def test_window_max_messages_is_validated(bad: Any) -> None:
    with pytest.raises(InvalidInput) as caught:
        append([], U(), max_messages=bad)
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, FlowmemError)
    with pytest.raises(InvalidInput):
        ConversationBuffer(max_messages=bad)


def test_window_none_is_unbounded(make: type[Runner]) -> None:
    buf = make(max_messages=None)
    result = buf.append([U(str(i)) for i in range(50)])
    assert report(result) == (50, 50, True)


def test_mem3_call_redeclared_in_a_later_append_is_healed_after_its_first_turn(
        make: type[Runner]) -> None:
    # each in its own append: the re-declaring turn must not take c1 over
    buf = make()
    buf.append(A("c1"))
    buf.append(A("c1", "c2"))
    result = buf.append(U())
    assert result.messages == [A("c1"), P("c1"), A("c1", "c2"), P("c2"), U()]


# --------------------------------------------------------------------------- a buffer handed in
# A list handed to ``append``/``ConversationBuffer`` was not necessarily built
# through append: a raw provider history can hold a re-fired result already.

RAW_WITH_DUPLICATE: list[Msg] = [T("c0", "a"), S("s"), A("c0"), T("c0", "b")]


def test_window_evicting_one_of_two_stored_results_keeps_the_id_answered_pure() -> None:
    first = append(RAW_WITH_DUPLICATE, U(), max_messages=4)  # evicts T(c0, "a")
    assert first.messages == [S("s"), A("c0"), T("c0", "b"), U()]
    refired = append(first.messages, T("c0", "c"), max_messages=4)
    assert refired.appended == 0  # MEM-1: T(c0, "b") still answers c0
    healed = append(first.messages, U("again"), max_messages=4)
    assert healed.messages == [A("c0"), T("c0", "b"), U(), U("again")]


def test_window_evicting_one_of_two_stored_results_keeps_the_id_answered_stateful() -> None:
    buf = ConversationBuffer(RAW_WITH_DUPLICATE, max_messages=4)
    buf.append(U())  # evicts T(c0, "a")
    refired = buf.append(T("c0", "c"))
    assert refired.appended == 0
    assert refired.messages == [S("s"), A("c0"), T("c0", "b"), U()]


def test_window_duplicate_loaded_result_goes_with_its_turn_stateful() -> None:
    buf = ConversationBuffer(RAW_WITH_DUPLICATE, max_messages=4)
    buf.append(U())  # evicts T(c0, "a")
    result = buf.append(U("again"))
    assert result.messages == [A("c0"), T("c0", "b"), U(), U("again")]


def test_window_evicting_a_turn_evicts_every_stored_result_of_its_calls(
        make: type[Runner]) -> None:
    buf = make([A("c0"), T("c0", "a"), T("c0", "b")], max_messages=3)
    result = buf.append(S("s"))
    assert result.messages == [S("s")]
    assert report(result) == (1, 1, True)
