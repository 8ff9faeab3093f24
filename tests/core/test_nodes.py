"""MEM-4 — assembly of message inputs; MEM-16 — text to message."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowmem.messages import ROLES, coerce_content
from flowmem.nodes import assemble, text_to_message
from flowmem.normalize import is_sendable, normalize

U1 = {"role": "user", "content": "one"}
U2 = {"role": "user", "content": "two"}
A1 = {"role": "assistant", "content": "three"}
S1 = {"role": "system", "content": "sys"}


# --------------------------------------------------------------------------- MEM-4


def test_mem4_inputs_flatten_in_declared_order_not_name_order() -> None:
    assert assemble([("zeta", [U1]), ("alpha", [U2]), ("mid", A1)]) == [U1, U2, A1]


def test_mem4_mapping_inputs_flatten_in_insertion_order() -> None:
    assert assemble({"zeta": U1, "alpha": [U2, A1]}) == [U1, U2, A1]
    assert assemble(OrderedDict([("b", S1), ("a", U1)])) == [S1, U1]


def test_mem4_list_contributes_its_items_and_message_contributes_one() -> None:
    assert assemble([("history", [U1, A1]), ("prompt", U2)]) == [U1, A1, U2]
    assert assemble([("history", (U1, A1))]) == [U1, A1]


def test_mem4_unwired_or_empty_input_contributes_nothing() -> None:
    assert assemble([("a", None), ("b", []), ("c", ()), ("d", U1), ("e", None)]) == [U1]
    assert assemble({"a": None, "b": []}) == []
    assert assemble([]) == []
    assert assemble({}) == []
    assert assemble(None) == []


def test_mem4_no_null_placeholder() -> None:
    assert None not in assemble([("a", None), ("b", U1), ("c", None)])


def test_mem4_items_are_passed_through_not_copied() -> None:
    out = assemble([("a", [U1])])
    assert out[0] is U1


def test_mem4_same_port_name_twice_keeps_both_in_order() -> None:
    assert assemble([("x", U1), ("x", U2)]) == [U1, U2]


def test_mem4_does_not_mutate_inputs() -> None:
    history = [U1, A1]
    assemble([("h", history), ("p", U2)])
    assert history == [U1, A1]


@pytest.mark.parametrize("bad", [["not a pair"], [("only",)], [("a", U1, "extra")], [U1]])
def test_mem4_sequence_items_must_be_pairs(bad: Any) -> None:
    with pytest.raises(TypeError):
        assemble(bad)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(
    st.text(max_size=3),
    st.one_of(st.none(), st.builds(dict, content=st.integers()),
              st.lists(st.builds(dict, content=st.integers()), max_size=3)))))
def test_mem4_property_flatten_is_concatenation_in_order(pairs: list[tuple[str, Any]]) -> None:
    expected: list[Any] = []
    for _name, value in pairs:
        expected += [] if value is None else value if isinstance(value, list) else [value]
    assert assemble(pairs) == expected
    assert assemble(dict(pairs)) == assemble(list(dict(pairs).items()))


# --------------------------------------------------------------------------- MEM-16


@pytest.mark.parametrize("role", ["user", "assistant", "system", "tool"])
def test_mem16_known_role_is_kept(role: str) -> None:
    rows, row = text_to_message("hello", role, "c1" if role == "tool" else None)
    assert row["role"] == role
    assert rows == [row]


@pytest.mark.parametrize("role", [None, "", "bogus", "User", " user ", 3, ["user"]])
def test_mem16_role_outside_the_four_becomes_user(role: Any) -> None:
    assert text_to_message("hello", role) == ([{"role": "user", "content": "hello"}],
                                              {"role": "user", "content": "hello"})


def test_mem16_absent_role_becomes_user() -> None:
    assert text_to_message("hello")[1] == {"role": "user", "content": "hello"}


@pytest.mark.parametrize(("text", "content"), [
    (3, "3"), (True, "true"), (False, "false"), (1.5, "1.5"),
    ([1, "a"], '[1, "a"]'), ({"k": None}, '{"k": null}'), ("  ", "  "), ("\n", "\n"),
])
def test_mem16_content_is_coerced_as_in_mem5(text: Any, content: str) -> None:
    assert text_to_message(text)[1] == {"role": "user", "content": content}


@pytest.mark.parametrize("text", ["", None, {1, 2}])
@pytest.mark.parametrize("role", [None, "user", "tool", "assistant"])
def test_mem16_empty_content_emits_empty_list_and_empty_row(text: Any, role: Any) -> None:
    assert text_to_message(text, role, "c1") == ([], {})


def test_mem16_whitespace_is_content() -> None:
    assert text_to_message("   ", "assistant") == ([{"role": "assistant", "content": "   "}],
                                                    {"role": "assistant", "content": "   "})


def test_mem16_tool_call_id_is_kept_on_tool_row_trimmed() -> None:
    rows, row = text_to_message("42", "tool", "  call_1 ")
    assert row == {"role": "tool", "content": "42", "tool_call_id": "call_1"}
    assert rows == [row]


def test_mem16_int_tool_call_id_is_cast() -> None:
    assert text_to_message("r", "tool", 7)[1]["tool_call_id"] == "7"


@pytest.mark.parametrize("bad", [None, "", "  ", "\t\n", True, False, 1.5, ["a"]])
def test_mem16_blank_or_no_tool_call_id_is_omitted(bad: Any) -> None:
    assert text_to_message("r", "tool", bad) == ([{"role": "tool", "content": "r"}],
                                                 {"role": "tool", "content": "r"})


@pytest.mark.parametrize(("given", "kept"), [("0", "0"), (" 0 ", "0"), (0, "0"), ("00", "00")])
def test_mem16_zero_is_not_blank_so_it_is_kept(given: Any, kept: str) -> None:
    # MEM-16 omits the id "when blank" and only then; "0" is unusable for pairing
    # (MEM-5) and identity (MEM-6, MEM-13) but it is not blank.
    assert text_to_message("r", "tool", given)[1] == {"role": "tool", "content": "r",
                                                      "tool_call_id": kept}


def test_mem16_kept_zero_id_is_still_unusable_for_pairing_mem5() -> None:
    # The row keeps "0"; normalization then treats it as an unusable result id and
    # drops the row as an orphan (MEM-5), so nothing unsendable reaches a provider.
    rows, _ = text_to_message("r", "tool", "0")
    assert is_sendable(normalize(rows).messages)


@pytest.mark.parametrize("role", [None, "user", "assistant", "system", "bogus"])
def test_mem16_tool_call_id_is_dropped_off_non_tool_rows(role: Any) -> None:
    assert "tool_call_id" not in text_to_message("r", role, "call_1")[1]


def test_mem16_row_alone_is_an_equal_but_separate_dict() -> None:
    rows, row = text_to_message("hi")
    assert rows[0] == row
    assert rows[0] is not row


def test_mem4_mem16_text_rows_assemble_into_a_sendable_list() -> None:
    system = text_to_message("be brief", "system")[0]
    prompt = text_to_message("hello")[1]
    assert is_sendable(assemble([("system", system), ("history", []), ("prompt", prompt)]))


TEXTS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=4),
                  st.lists(st.integers(), max_size=2), st.sets(st.integers(), max_size=2))
ROLES_ANY = st.one_of(st.none(), st.sampled_from(sorted(ROLES)), st.text(max_size=4),
                      st.integers())
IDS = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=4))


@settings(max_examples=200, deadline=None)
@given(TEXTS, ROLES_ANY, IDS)
def test_mem16_property_row_shape(text: Any, role: Any, tool_call_id: Any) -> None:
    rows, row = text_to_message(text, role, tool_call_id)
    content = coerce_content(text)
    if content == "":
        assert (rows, row) == ([], {})
        return
    assert rows == [row]
    assert row["content"] == content
    assert row["role"] == (role if role in ROLES and isinstance(role, str) else "user")
    assert set(row) <= {"role", "content", "tool_call_id"}
    if "tool_call_id" in row:
        assert row["role"] == "tool"
        assert row["tool_call_id"] == row["tool_call_id"].strip() != ""
    elif row["role"] == "tool" and isinstance(tool_call_id, str | int) \
            and not isinstance(tool_call_id, bool):
        assert str(tool_call_id).strip() == ""  # omitted only when blank (MEM-16)
