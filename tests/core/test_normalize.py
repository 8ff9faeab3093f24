"""MEM-5 — normalization: any message list to a provider-sendable one."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowmem.messages import HEALED_CONTENT
from flowmem.normalize import NormalizeResult, is_sendable, normalize, sendability_problems


def call(cid: Any) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": "f", "arguments": "{}"}}


def A(content: Any, *ids: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if ids:
        message["tool_calls"] = [call(cid) for cid in ids]
    return message


def T(cid: Any, content: Any = "result") -> dict[str, Any]:
    return {"role": "tool", "content": content, "tool_call_id": cid}


def U(content: Any = "hi") -> dict[str, Any]:
    return {"role": "user", "content": content}


def S(content: Any = "be nice") -> dict[str, Any]:
    return {"role": "system", "content": content}


def HEAL(cid: str) -> dict[str, Any]:
    return {"role": "tool", "content": HEALED_CONTENT, "tool_call_id": cid}


def check(messages: Any, expected: list[dict[str, Any]], dropped: int) -> None:
    result = normalize(messages)
    assert result.messages == expected
    assert result.dropped == dropped
    assert is_sendable(result.messages), sendability_problems(result.messages)


# --------------------------------------------------------------------------- spec examples


def test_mem5_spec_example_zero_id_call_and_result_give_empty_list_with_3_drops() -> None:
    check([A("", "0"), T("0")], [], 3)


def test_mem5_non_mapping_entries_are_dropped_and_counted() -> None:
    check([1, "user", None, ["role", "user"], U()], [U()], 4)


@pytest.mark.parametrize("bad", [
    {"content": "no role"},
    {"role": None, "content": "x"},
    {"role": "bogus", "content": "x"},
    {"role": "User", "content": "x"},
    {"role": ["user"], "content": "x"},
    {"role": 3, "content": "x"},
])
def test_mem5_entry_without_one_of_the_four_roles_is_dropped(bad: dict[str, Any]) -> None:
    check([U(), bad], [U()], 1)


@pytest.mark.parametrize(("content", "text"), [
    (None, ""),
    (True, "true"),
    (False, "false"),
    (3, "3"),
    (-7, "-7"),
    (1.5, "1.5"),
    ("  ", "  "),
    ([1, 2], "[1, 2]"),
    ({"a": 1}, '{"a": 1}'),
    ({"a": [{"b": None}]}, '{"a": [{"b": null}]}'),
    ({1, 2}, ""),
    ({"a": {1}}, ""),
    (float("nan"), "nan"),
])
def test_mem5_content_is_coerced_to_text(content: Any, text: str) -> None:
    check([U(content)], [U(text)], 0)


def test_mem5_system_messages_move_to_front_both_groups_keep_order() -> None:
    check([U("u1"), S("s1"), A("a1"), S("s2"), U("u2")],
          [S("s1"), S("s2"), U("u1"), A("a1"), U("u2")], 0)


def test_mem5_system_message_is_never_dropped_and_keeps_only_role_and_content() -> None:
    system = {"role": "system", "content": None, "tool_calls": [call("a")],
              "tool_call_id": "a", "metadata": {"x": 1}}
    check([system, system], [S(""), S("")], 0)


def test_mem5_unanswered_calls_get_synthetic_results_adjacent_in_declaration_order() -> None:
    check([U(), A("", "a", "b"), U("next")],
          [U(), A("", "a", "b"), HEAL("a"), HEAL("b"), U("next")], 0)


def test_mem5_synthetic_result_goes_after_the_real_ones_of_the_block() -> None:
    check([A("", "a", "b", "c"), T("b")],
          [A("", "a", "b", "c"), T("b"), HEAL("a"), HEAL("c")], 0)


def test_mem5_orphan_result_is_dropped() -> None:
    check([U(), T("x")], [U()], 1)


def test_mem5_result_placed_before_its_call_is_an_orphan() -> None:
    check([U(), T("a"), A("", "a")], [U(), A("", "a"), HEAL("a")], 1)


def test_mem5_result_after_a_later_user_turn_moves_into_the_block() -> None:
    check([A("", "a"), U(), T("a", "late")], [A("", "a"), T("a", "late"), U()], 0)


def test_mem5_result_outside_the_block_is_a_duplicate_when_answered() -> None:
    check([A("", "a"), T("a", "r1"), U(), T("a", "r2")], [A("", "a"), T("a", "r1"), U()], 1)


def test_mem5_duplicate_result_in_the_block_is_dropped() -> None:
    check([A("", "a"), T("a", "r1"), T("a", "r2")], [A("", "a"), T("a", "r1")], 1)


def test_mem5_id_declared_again_is_removed_from_the_later_turn() -> None:
    check([A("first", "a"), T("a", "r1"), A("second", "a", "b"), T("a", "r2"), T("b", "r3")],
          [A("first", "a"), T("a", "r1"), A("second", "b"), T("b", "r3")], 2)


def test_mem5_late_result_for_redeclared_id_belongs_to_the_first_declaration() -> None:
    check([A("first", "a"), U(), A("second", "a"), T("a", "r")],
          [A("first", "a"), T("a", "r"), U(), A("second")], 1)


def test_mem5_turn_emptied_by_redeclaration_goes_too_counting_call_and_turn() -> None:
    check([A("", "a"), T("a"), A("", "a")], [A("", "a"), T("a")], 2)


def test_mem5_same_id_twice_in_one_turn_keeps_the_first_declaration() -> None:
    check([A("", "a", "a"), T("a")], [A("", "a"), T("a")], 1)


@pytest.mark.parametrize("bad", ["0", "", "  ", 0, True, False, None, 1.5, ["a"]])
def test_mem5_call_with_unusable_id_is_removed_with_its_result(bad: Any) -> None:
    check([A("text", bad, "b"), T(bad)], [A("text", "b"), HEAL("b")], 2)


@pytest.mark.parametrize("entry", ["a", 1, None, ["id", "a"]])
def test_mem5_non_mapping_call_entry_is_removed(entry: Any) -> None:
    turn = {"role": "assistant", "content": "x", "tool_calls": [entry]}
    check([turn], [A("x")], 1)


@pytest.mark.parametrize("content", ["", None])
def test_mem5_assistant_turn_with_no_calls_and_empty_content_is_dropped(content: Any) -> None:
    check([U(), A(content)], [U()], 1)


def test_mem5_assistant_whitespace_content_is_content() -> None:
    check([U(), A(" ")], [U(), A(" ")], 0)


def test_mem5_assistant_with_empty_content_and_calls_is_kept() -> None:
    check([A(None, "a"), T("a")], [A("", "a"), T("a")], 0)


def test_mem5_user_with_empty_content_is_kept() -> None:
    check([U(None)], [U("")], 0)


def test_mem5_leading_tool_message_is_stripped() -> None:
    check([S(), T("a"), U()], [S(), U()], 1)


def test_mem5_block_keeps_arrival_order_of_results() -> None:
    check([A("", "a", "b"), T("b"), T("a")], [A("", "a", "b"), T("b"), T("a")], 0)


# --------------------------------------------------------------------------- shapes (MEM-11)


def test_mem5_call_id_read_from_either_spelling() -> None:
    turn = {"role": "assistant", "content": "", "tool_calls": [
        {"tool_call_id": "a"}, {"id": "b", "type": "function"}]}
    check([turn, T("a"), T("b")],
          [{"role": "assistant", "content": "", "tool_calls": [
              {"tool_call_id": "a"}, {"id": "b", "type": "function"}]}, T("a"), T("b")], 0)


def test_mem5_canonical_shape_is_read_and_flattened() -> None:
    canonical = [
        {"role": "user", "content": "q", "metadata": {"name": "ann"}},
        {"role": "assistant", "content": None,
         "metadata": {"tool_calls": [call("a")], "model": "m"}},
        {"role": "tool", "content": {"temp": 3},
         "metadata": {"tool_call_id": "a", "healed": False}},
    ]
    check(canonical, [U("q"), A("", "a"), T("a", '{"temp": 3}')], 0)


def test_mem5_healed_placeholder_in_canonical_shape_answers_its_call() -> None:
    placeholder = {"role": "tool", "content": HEALED_CONTENT,
                   "metadata": {"tool_call_id": "a", "healed": True}}
    check([A("", "a"), placeholder], [A("", "a"), HEAL("a")], 0)


def test_mem5_call_and_result_carry_the_same_trimmed_id_string() -> None:
    """MEM-5/MEM-11: a provider matches ids as strings, so " a " and 7 are written back as read."""
    check([A("", " a ", 7), T("a"), T(7)], [A("", "a", "7"), T("a"), T("7")], 0)


def test_mem5_kept_call_entries_are_copied_as_given_but_only_the_kept_ones() -> None:
    given_calls: list[dict[str, Any]] = [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}, "extra": [1]},
        {"id": "0"},
    ]
    result = normalize([{"role": "assistant", "content": "", "tool_calls": given_calls}])
    assert result.messages[0]["tool_calls"] == [given_calls[0]]
    assert result.messages[0]["tool_calls"][0] is not given_calls[0]
    assert result.messages[0]["tool_calls"][0]["function"] is not given_calls[0]["function"]
    assert result.dropped == 1


def test_mem5_output_has_only_flat_fields() -> None:
    messy = [{"role": "user", "content": "q", "name": "x", "tool_call_id": "a",
              "tool_calls": [call("a")]},
             {"role": "tool", "content": "r", "tool_calls": [call("b")]}]
    check(messy, [U("q")], 1)


# --------------------------------------------------------------------------- API


def test_mem5_accepts_tuples_generators_none_and_a_lone_message() -> None:
    assert normalize((U(), A("a"))).messages == [U(), A("a")]
    assert normalize(m for m in [U()]).messages == [U()]
    assert normalize(None) == NormalizeResult([], 0)
    assert normalize(U()) == NormalizeResult([U()], 0)
    assert normalize("text") == NormalizeResult([], 1)


def test_mem5_result_is_frozen() -> None:
    result = normalize([U()])
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.dropped = 3  # type: ignore[misc]


def test_mem5_does_not_mutate_the_input() -> None:
    given_messages = [S(), U(), A(None, "a", "0", "a"), T("a"), T("a"), U(None), T("b"), 3]
    snapshot = copy.deepcopy(given_messages)
    normalize(given_messages)
    assert given_messages == snapshot


def test_mem5_is_linear_on_a_long_list() -> None:
    n = 20_000
    messages: list[Any] = []
    for i in range(n):
        messages += [U(f"q{i}"), A("", f"c{i}", "dup"), T("dup"), T(f"c{i}")]
    result = normalize(messages)
    assert result.dropped == (n - 1) + (n - 1)  # repeated "dup" declarations + their results
    assert len(result.messages) == 3 * n + 1


# --------------------------------------------------------------------------- properties

IDS = st.sampled_from(["a", "b", "c", " a ", "b ", "0", "", "  ", 0, 1, 2, True, False, None])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5))
CONTENT = st.recursive(
    SCALARS | st.sets(st.integers(), max_size=2) | st.frozensets(st.text(max_size=2), max_size=2),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    | st.tuples(inner),
    max_leaves=6,
)
ROLE = st.sampled_from(["system", "user", "assistant", "assistant", "tool", "tool", "bogus", ""])


@st.composite
def call_entries(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["id", "tool_call_id", "both", "junk"]))
    if kind == "junk":
        return draw(st.one_of(SCALARS, st.lists(IDS, max_size=2)))
    entry: dict[str, Any] = {}
    if kind in ("id", "both"):
        entry["id"] = draw(IDS)
    if kind in ("tool_call_id", "both"):
        entry["tool_call_id"] = draw(IDS)
    if draw(st.booleans()):
        entry["type"] = "function"
        entry["function"] = {"name": draw(st.text(max_size=3)), "arguments": "{}"}
    return entry


GOOD_IDS = st.sampled_from(["a", "b", "c", " a ", 1])


@st.composite
def plausible(draw: st.DrawFn) -> dict[str, Any]:
    """A mostly well-formed turn or result, so pairing repair gets exercised."""
    shape = draw(st.sampled_from(["flat", "canonical"]))
    role = draw(st.sampled_from(["user", "assistant", "assistant", "tool", "tool", "system"]))
    fields: dict[str, Any] = {}
    if role == "assistant":
        ids = draw(st.lists(GOOD_IDS, min_size=1, max_size=3))
        fields["tool_calls"] = [{"id": cid} for cid in ids]
    if role == "tool":
        fields["tool_call_id"] = draw(GOOD_IDS)
    content = draw(st.one_of(st.none(), st.text(max_size=2)))
    if shape == "flat":
        return {"role": role, "content": content, **fields}
    return {"role": role, "content": content, "metadata": fields}


@st.composite
def messages(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 3)) > 0:
        return draw(plausible())
    if draw(st.integers(0, 9)) == 0:
        return draw(st.one_of(SCALARS, st.lists(SCALARS, max_size=2)))
    message: dict[str, Any] = {}
    if draw(st.integers(0, 9)) > 0:
        message["role"] = draw(ROLE)
    if draw(st.booleans()):
        message["content"] = draw(CONTENT)
    metadata: dict[str, Any] = {}
    where = draw(st.sampled_from(["top", "metadata"]))
    target = message if where == "top" else metadata
    if draw(st.booleans()):
        target["tool_calls"] = draw(st.lists(call_entries(), max_size=3))
    if draw(st.booleans()):
        target["tool_call_id"] = draw(IDS)
    if draw(st.booleans()):
        metadata["healed"] = draw(st.booleans())
    empty_metadata = draw(st.booleans())
    if metadata or empty_metadata:
        message["metadata"] = metadata
    return message


MESSY = st.lists(messages(), max_size=14)


@settings(max_examples=200, deadline=None)
@given(MESSY)
def test_mem5_property_output_is_always_sendable(given_messages: list[Any]) -> None:
    result = normalize(given_messages)
    assert sendability_problems(result.messages) == []
    assert result.dropped >= 0
    assert all(set(m) <= {"role", "content", "tool_calls", "tool_call_id"}
               for m in result.messages)


@settings(max_examples=200, deadline=None)
@given(MESSY)
def test_mem5_property_normalize_is_idempotent(given_messages: list[Any]) -> None:
    first = normalize(given_messages)
    second = normalize(first.messages)
    assert second.messages == first.messages
    assert second.dropped == 0


@settings(max_examples=200, deadline=None)
@given(MESSY)
def test_mem5_property_input_is_never_mutated(given_messages: list[Any]) -> None:
    snapshot = copy.deepcopy(given_messages)
    normalize(given_messages)
    assert given_messages == snapshot


@settings(max_examples=200, deadline=None)
@given(MESSY)
def test_mem5_property_drops_bound_the_lost_entries(given_messages: list[Any]) -> None:
    """MEM-5: every input entry that is not in the output was counted as a drop."""
    result = normalize(given_messages)
    synthetic = sum(1 for m in result.messages if m["content"] == HEALED_CONTENT)
    assert len(given_messages) - (len(result.messages) - synthetic) <= result.dropped
