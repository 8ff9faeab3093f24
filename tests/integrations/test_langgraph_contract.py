"""flowmem's ``add_messages`` against LangGraph's documented reducer semantics.

Written by us from LangGraph's ``add_messages`` docs and its own tests
(``libs/langgraph/tests/test_messages.py``), whose names each test cites:
ids assigned, replacement by id, ``RemoveMessage`` (an unknown id refused),
``REMOVE_ALL_MESSAGES``, dicts and tuples coerced, non-list inputs, a fresh
list returned. Then the rules on the messages new to the state, where flowmem
differs by design: a re-fired tool result is dropped (MEM-1), an interrupted
call healed at the next human turn (MEM-3). Reused call ids are left out here.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import REMOVE_ALL_MESSAGES

from flowmem.integrations.langgraph import MessagesState, add_messages


def test_add_single_and_multiple_messages() -> None:
    """``test_add_single_message``, ``test_add_multiple_messages``."""
    left = [HumanMessage("Hello", id="1")]
    assert add_messages(left, AIMessage("Hi there!", id="2")) == [
        HumanMessage("Hello", id="1"), AIMessage("Hi there!", id="2")]
    right = [AIMessage("Hi there!", id="2"), SystemMessage("System message", id="3")]
    assert add_messages(left, right) == [left[0], *right]


def test_update_existing_message_and_duplicates_in_input() -> None:
    """``test_update_existing_message``, ``test_duplicates_in_input``: the later
    message with an id replaces the earlier one in place."""
    assert add_messages([HumanMessage("Hello", id="1")], HumanMessage("Hello again", id="1")) \
        == [HumanMessage("Hello again", id="1")]
    result = add_messages([], [AIMessage("Hi there!", id="1"), AIMessage("again", id="1")])
    assert [(m.id, m.content) for m in result] == [("1", "again")]


def test_missing_ids_are_assigned() -> None:
    """``test_missing_ids``, ``test_right_with_none_ids_pure_append``."""
    result = add_messages([HumanMessage("Hello")], [AIMessage("a"), AIMessage("b")])
    assert len(result) == 3 and len({m.id for m in result}) == 3
    assert all(isinstance(m.id, str) and UUID(m.id, version=4) for m in result)


def test_remove_messages() -> None:
    """``test_mixed_operations``, ``test_delete_all``, ``test_remove_nonexistent_message``."""
    left = [HumanMessage("Hello", id="1"), AIMessage("Hi there!", id="2")]
    assert add_messages(left, [HumanMessage("Updated hello", id="1"), RemoveMessage(id="2"),
                               SystemMessage("New message", id="3")]) == [
        HumanMessage("Updated hello", id="1"), SystemMessage("New message", id="3")]
    assert add_messages(left, [RemoveMessage(id="1"), RemoveMessage(id="2")]) == []
    with pytest.raises(ValueError, match="doesn't exist"):
        add_messages(left, RemoveMessage(id="9"))


def test_remove_all_messages() -> None:
    """``test_remove_all_messages``: everything before the marker goes, right's too."""
    left = [HumanMessage("Hello"), AIMessage("Hi there!")]
    assert add_messages(left, [RemoveMessage(id=REMOVE_ALL_MESSAGES)]) == []
    result = add_messages(left, [HumanMessage("Updated hello"),
                                 RemoveMessage(id=REMOVE_ALL_MESSAGES),
                                 HumanMessage("Updated hi there")])
    assert [m.content for m in result] == ["Updated hi there"]


def test_inputs_coerced() -> None:
    """``test_empty_inputs``, ``test_non_list_inputs``, ``test_left_as_dicts_is_normalized``,
    ``test_left_as_tuples_is_normalized``, ``test_left_starting_with_chunk_is_normalized``,
    ``test_fast_path_returns_fresh_list``."""
    assert add_messages([], []) == []
    assert add_messages(HumanMessage("Hello", id="1"), AIMessage("Hi", id="2")) == [
        HumanMessage("Hello", id="1"), AIMessage("Hi", id="2")]
    result = add_messages([{"role": "user", "content": "hi", "id": "d1"}, ("user", "yo")],
                          [AIMessage("reply", id="a1")])
    assert [type(m).__name__ for m in result] == ["HumanMessage", "HumanMessage", "AIMessage"]
    assert result[0].id == "d1" and isinstance(result[1].id, str)
    chunked = add_messages([AIMessageChunk(content="chunk", id="c1")], [])
    assert type(chunked[0]).__name__ == "AIMessage"
    left = [HumanMessage("prior", id="1")]
    assert add_messages(left, [AIMessage("new", id="2")]) is not left and len(left) == 1


def test_messages_state_in_a_graph() -> None:
    """``test_messages_state``: a graph over flowmem's ``MessagesState``."""
    def foo(state: Any) -> dict[str, Any]:
        return {"messages": [HumanMessage("foo")]}

    graph = StateGraph(MessagesState)
    graph.add_node("foo", foo)
    graph.add_edge(START, "foo")
    graph.add_edge("foo", END)
    result = graph.compile().invoke({"messages": [("user", "meow")]})
    assert [(m.type, m.content) for m in result["messages"]] == [("human", "meow"),
                                                                 ("human", "foo")]


CALL = {"name": "search", "args": {"q": "cats"}, "id": "c1", "type": "tool_call"}


def test_differs_by_design_refired_result_dropped() -> None:
    """LangGraph keeps a second ``ToolMessage`` for the same call (new id); flowmem
    drops it (MEM-1): a provider refuses a call answered twice."""
    left = add_messages([HumanMessage("Find cats")], [AIMessage("", tool_calls=[CALL])])
    result = add_messages(left, [ToolMessage("3 cats", tool_call_id="c1"),
                                 ToolMessage("3 cats", tool_call_id="c1")])
    assert [m.type for m in result] == ["human", "ai", "tool"]


def test_differs_by_design_interrupted_call_healed() -> None:
    """LangGraph leaves a call without result dangling; flowmem heals it before the
    next human turn (MEM-3), then a late result replaces the placeholder (MEM-10)."""
    left = add_messages([HumanMessage("Find cats")], [AIMessage("", tool_calls=[CALL])])
    healed = add_messages(left, [HumanMessage("Never mind")])
    assert [m.type for m in healed] == ["human", "ai", "tool", "human"]
    assert healed[2].additional_kwargs == {"healed": True} and healed[2].status == "error"
    late = add_messages(healed, [ToolMessage("3 cats", tool_call_id="c1")])
    assert [m.content for m in late][2] == "3 cats" and len(late) == 4
