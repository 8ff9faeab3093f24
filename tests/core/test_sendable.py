"""MEM-5 — the Sendable invariant that every normalized list satisfies.

Sendable: all system messages first; the first non-system message is not a
tool result; every tool result sits in the contiguous block right after the
assistant turn declaring its id; each declared id has exactly one result there;
no id is declared or answered twice; content is a string; every message is a
mapping with one of the four roles; no declared call or result has an unusable
id. Both the flat provider shape and the canonical shape are read (MEM-11).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowmem.normalize import is_sendable, normalize, sendability_problems


def A(*ids: Any, content: Any = "") -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if ids:
        message["tool_calls"] = [{"id": cid, "type": "function",
                                  "function": {"name": "f", "arguments": "{}"}} for cid in ids]
    return message


def T(cid: Any, content: Any = "r") -> dict[str, Any]:
    return {"role": "tool", "content": content, "tool_call_id": cid}


def U(content: Any = "hi") -> dict[str, Any]:
    return {"role": "user", "content": content}


def S(content: Any = "sys") -> dict[str, Any]:
    return {"role": "system", "content": content}


def canonical(message: dict[str, Any]) -> dict[str, Any]:
    """The same message in the canonical shape: pairing fields inside metadata."""
    metadata = {k: v for k, v in message.items() if k not in ("role", "content")}
    return {"role": message["role"], "content": message["content"], "metadata": metadata}


def problems_mentioning(messages: list[Any], *words: str) -> list[str]:
    found = sendability_problems(messages)
    assert found, "expected the list not to be sendable"
    assert not is_sendable(messages)
    matching = [p for p in found if all(w in p for w in words)]
    assert matching, found
    return matching


GOOD = [S(), S("two"), U(), A("a", "b"), T("b"), T("a"), A(content="text"), U(), A("c"), T("c")]


def test_mem5_sendable_conversation_has_no_problems() -> None:
    assert sendability_problems(GOOD) == []
    assert is_sendable(GOOD)


def test_mem5_canonical_shape_is_accepted() -> None:
    assert sendability_problems([canonical(m) for m in GOOD]) == []


def test_mem5_mixed_shapes_and_id_spellings_are_accepted() -> None:
    turn = {"role": "assistant", "content": "",
            "metadata": {"tool_calls": [{"tool_call_id": "a"}, {"id": "b"}]}}
    assert is_sendable([U(), turn, canonical(T("a")), T("b")])


def test_mem5_empty_list_is_sendable() -> None:
    assert is_sendable([])
    assert is_sendable(None)


def test_mem5_system_after_non_system_is_a_problem() -> None:
    problems_mentioning([U(), S()], "system")


def test_mem5_leading_tool_is_a_problem() -> None:
    problems_mentioning([S(), T("a")], "first non-system")


def test_mem5_tool_outside_its_block_is_a_problem() -> None:
    problems_mentioning([A("a"), U(), T("a")], "'a'", "not in the block")


def test_mem5_tool_after_a_turn_that_does_not_declare_it_is_a_problem() -> None:
    problems_mentioning([A("a"), T("a"), A("b"), T("a")], "'a'", "answered twice")
    problems_mentioning([A("a"), T("a"), A("b"), T("c"), T("b")], "'c'", "not in the block")


def test_mem5_system_message_breaks_the_block() -> None:
    problems_mentioning([A("a"), S(), T("a")], "not in the block")


def test_mem5_unanswered_call_is_a_problem() -> None:
    problems_mentioning([U(), A("a", "b"), T("a"), U()], "'b'", "no result")
    problems_mentioning([U(), A("a")], "'a'", "no result")


def test_mem5_id_declared_twice_is_a_problem() -> None:
    problems_mentioning([A("a"), T("a"), A("a"), T("a")], "'a'", "declared twice")
    problems_mentioning([A("a", "a"), T("a")], "'a'", "declared twice")


def test_mem5_id_answered_twice_is_a_problem() -> None:
    problems_mentioning([A("a"), T("a"), T("a")], "'a'", "answered twice")


def test_mem5_ids_are_compared_after_trimming() -> None:
    assert is_sendable([A(" a "), T("a")])
    assert is_sendable([A(7), T("7")])
    problems_mentioning([A("a"), T("a"), A(" a "), T("a ")], "declared twice")


@pytest.mark.parametrize("bad", ["0", "", "  ", 0, True, None, 1.5])
def test_mem5_unusable_ids_are_problems(bad: Any) -> None:
    problems_mentioning([A(bad, content="x")], "no usable id")
    problems_mentioning([A("a"), T("a"), T(bad)], "no usable id")


def test_mem5_non_mapping_call_entry_is_a_problem() -> None:
    turn = {"role": "assistant", "content": "", "tool_calls": ["a"]}
    problems_mentioning([turn], "no usable id")


@pytest.mark.parametrize("content", [None, 3, True, ["x"], {"a": 1}])
def test_mem5_non_string_content_is_a_problem(content: Any) -> None:
    problems_mentioning([U(content)], "content")


@pytest.mark.parametrize("bad", [3, "user", None, {"content": "x"}, {"role": "bogus"},
                                 {"role": ["user"], "content": "x"}])
def test_mem5_non_message_or_roleless_entry_is_a_problem(bad: Any) -> None:
    problems_mentioning([U(), bad], "message 1")


def test_mem5_every_problem_is_reported() -> None:
    found = sendability_problems([T("x"), U(None), S(), A("a"), A("a")])
    assert len(found) >= 5


# --------------------------------------------------------------------------- properties


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A well-formed conversation built by construction, unique ids throughout."""
    out: list[dict[str, Any]] = [S(draw(st.text(max_size=3)))
                                 for _ in range(draw(st.integers(0, 2)))]
    next_id = 0
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.booleans()):
            out.append(U(draw(st.text(max_size=3))))
            continue
        n = draw(st.integers(0, 3))
        ids = [f"call_{next_id + k}" for k in range(n)]
        next_id += n
        # a turn with no calls has content: normalize drops an empty one (MEM-5)
        out.append(A(*ids, content=draw(st.text(min_size=0 if n else 1, max_size=3))))
        out.extend(T(cid) for cid in draw(st.permutations(ids)))
    return out


@settings(max_examples=200, deadline=None)
@given(conversations(), st.booleans())
def test_mem5_property_well_formed_conversations_are_sendable_in_both_shapes(
        conversation: list[dict[str, Any]], as_canonical: bool) -> None:
    given_messages = [canonical(m) for m in conversation] if as_canonical else conversation
    assert sendability_problems(given_messages) == []
    result = normalize(given_messages)
    assert result.dropped == 0
    assert len(result.messages) == len(conversation)


@settings(max_examples=200, deadline=None)
@given(conversations().filter(lambda c: any(m["role"] == "tool" for m in c)), st.data())
def test_mem5_property_removing_a_result_breaks_sendability(
        conversation: list[dict[str, Any]], data: st.DataObject) -> None:
    tools = [i for i, m in enumerate(conversation) if m["role"] == "tool"]
    index = data.draw(st.sampled_from(tools))
    assert not is_sendable(conversation[:index] + conversation[index + 1:])
