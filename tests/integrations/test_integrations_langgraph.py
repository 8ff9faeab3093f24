"""LangGraph: flowmem's add_messages reducer (issue #13).

Mirrored from LangGraph's own ``add_messages`` tests (``tests/test_messages.py``),
each run against LangGraph's reducer too: add one and several, update an
existing id, missing ids assigned, remove, removing an unknown id raises,
mixed operations, empty inputs, non-list inputs, delete all,
REMOVE_ALL_MESSAGES, dicts/tuples coerced, ``format="langchain-openai"``.
Then the GR-MEM rules, and a ``StateGraph`` with a tool node and an
``InMemorySaver`` checkpointer.
"""

from __future__ import annotations

from typing import Annotated, Any

import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages as langgraph_add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from typing_extensions import TypedDict

from flowmem.integrations.langgraph import REMOVE_ALL_MESSAGES, add_messages
from flowmem.integrations.langgraph import add_messages as flowmem_add_messages
from integrations_support import ScriptedChatModel, openai_problems, tool_call

# -- LangGraph's semantics, side by side with LangGraph's own reducer -------------

@pytest.mark.parametrize("reducer", [add_messages, langgraph_add_messages])
def test_langgraph_semantics(reducer: Any) -> None:
    left = [HumanMessage("Hello", id="1")]
    assert reducer(left, AIMessage("Hi", id="2")) == [HumanMessage("Hello", id="1"),
                                                      AIMessage("Hi", id="2")]
    assert reducer(left, [HumanMessage("again", id="1")]) == [HumanMessage("again", id="1")]
    merged = reducer([HumanMessage("no id")], [AIMessage("none either")])
    assert all(m.id for m in merged)
    assert reducer([HumanMessage("a", id="1"), AIMessage("b", id="2")],
                   [RemoveMessage(id="1")]) == [AIMessage("b", id="2")]
    with pytest.raises(ValueError, match="doesn't exist"):
        reducer(left, [RemoveMessage(id="nope")])
    assert reducer([HumanMessage("a", id="1")],
                   [RemoveMessage(id=REMOVE_ALL_MESSAGES), AIMessage("fresh", id="9")]) == \
        [AIMessage("fresh", id="9")]
    coerced = reducer([], [{"role": "user", "content": "hi", "id": "u"}, ("assistant", "yo")])
    assert [(type(m), m.content) for m in coerced] == [(HumanMessage, "hi"), (AIMessage, "yo")]
    formatted = reducer(format="langchain-openai")(
        [], [HumanMessage([{"type": "text", "text": "x"}], id="f")])
    assert formatted[0].content == "x"
    with pytest.raises(ValueError):
        reducer([], [], format="nope")


@pytest.mark.parametrize("reducer", [add_messages, langgraph_add_messages])
def test_langgraph_semantics_mixed_empty_single_delete_all(reducer: Any) -> None:
    both = [HumanMessage("a", id="1"), AIMessage("b", id="2")]
    assert reducer(both, [HumanMessage("a2", id="1"), RemoveMessage(id="2"),
                          SystemMessage("c", id="3")]) == [HumanMessage("a2", id="1"),
                                                           SystemMessage("c", id="3")]
    assert reducer([], []) == []
    assert reducer(both, []) == both
    assert reducer(HumanMessage("a", id="1"), AIMessage("b", id="2")) == both
    assert reducer(both, [RemoveMessage(id="1"), RemoveMessage(id="2")]) == []


# -- the GR-MEM rules -----------------------------------------------------------

def test_refired_result_is_kept_once() -> None:  # MEM-1
    state = add_messages([], [HumanMessage("q"), AIMessage("", tool_calls=[tool_call("c1", "P")]),
                              ToolMessage("r", tool_call_id="c1")])
    assert add_messages(state, ToolMessage("r again", tool_call_id="c1")) == state
    langgraph = langgraph_add_messages(state, ToolMessage("r again", tool_call_id="c1"))
    assert len(langgraph) == len(state) + 1  # LangGraph keeps both


def test_resent_turn_is_dropped_and_heal_and_late_result() -> None:  # MEM-2, 3, 10
    """The strict call-id policy: a turn re-declaring only known ids is dropped (a new
    message id does not make it new; under the default ``per_turn`` it would be)."""
    add_messages = flowmem_add_messages(call_ids="strict")
    turn = AIMessage("", tool_calls=[tool_call("c1", "P"), tool_call("c2", "R")])
    state = add_messages([], [HumanMessage("q"), turn, ToolMessage("r1", tool_call_id="c1")])
    state = add_messages(state, AIMessage("", tool_calls=[tool_call("c1", "P")]))
    assert len(state) == 3
    state = add_messages(state, HumanMessage("well?"))
    assert [type(m).__name__ for m in state] == ["HumanMessage", "AIMessage", "ToolMessage",
                                                 "ToolMessage", "HumanMessage"]
    placeholder = state[3]
    assert placeholder.tool_call_id == "c2" and placeholder.additional_kwargs["healed"]
    assert openai_problems(state) == []
    state = add_messages(state, ToolMessage("late r2", tool_call_id="c2"))
    assert state[3].content == "late r2" and len(state) == 5
    assert add_messages(state, ToolMessage("late again", tool_call_id="c2")) == state


def test_heal_inside_one_update() -> None:
    state = add_messages([], [HumanMessage("q"), AIMessage("", tool_calls=[tool_call("c1", "P")]),
                              HumanMessage("next"), ToolMessage("late", tool_call_id="c1")])
    assert [m.content for m in state] == ["q", "", "late", "next"]


# -- a StateGraph with a tool node and a checkpointer ---------------------------

class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def test_state_graph_with_tool_node_and_checkpointer() -> None:
    model = ScriptedChatModel(replies=[
        AIMessage("", tool_calls=[tool_call("c1", "Paris")]),
        AIMessage("Sunny in Paris."),
        AIMessage("", tool_calls=[tool_call("c2", "Rome")]),
        AIMessage("OK, no Rome."),
    ])
    builder = StateGraph(State)
    builder.add_node("model", lambda state: {"messages": [model.invoke(state["messages"])]})
    builder.add_node("tools", ToolNode([weather]))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    graph = builder.compile(checkpointer=InMemorySaver(), interrupt_before=["tools"])
    config: Any = {"configurable": {"thread_id": "t1"}}

    graph.invoke({"messages": [HumanMessage("Weather in Paris?")]}, config)
    graph.invoke(None, config)  # run the tool node, then the model
    graph.update_state(config, {"messages": [ToolMessage("sunny in Paris", tool_call_id="c1")]})
    graph.invoke({"messages": [HumanMessage("And Rome?")]}, config)  # stops before tools
    graph.invoke({"messages": [HumanMessage("Never mind.")]}, config)  # c2 interrupted

    for sent in model.seen:
        assert openai_problems(sent) == []
    messages = graph.get_state(config).values["messages"]
    results = [m.tool_call_id for m in messages if isinstance(m, ToolMessage)]
    assert results == ["c1", "c2"]
    healed = messages[[m.id for m in messages].index(
        next(m.id for m in messages if isinstance(m, ToolMessage) and m.tool_call_id == "c2"))]
    assert healed.additional_kwargs == {"healed": True}
    assert openai_problems(messages) == []


# -- the reducer agrees with flowmem's own buffer, update by update ------------

from hypothesis import assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import flowmem  # noqa: E402
from flowmem.call_ids import caller_messages  # noqa: E402
from flowmem.integrations.langchain import to_entries  # noqa: E402

IDS = st.sampled_from(["c1", "c2", "c3", "c4"])
MESSAGE = st.one_of(
    st.builds(lambda n: HumanMessage(f"u{n}"), st.integers(0, 9)),
    st.builds(lambda ids, n: AIMessage(f"a{n}", tool_calls=[tool_call(i, "x") for i in ids]),
              st.lists(IDS, max_size=3, unique=True), st.integers(0, 9)),
    st.builds(lambda i, n: ToolMessage(f"r{n}", tool_call_id=i), IDS, st.integers(0, 9)),
)


def shape(entries: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(m["role"], m["content"], m["metadata"].get("tool_call_id"),
             tuple(c["id"] for c in m["metadata"].get("tool_calls") or ()),
             bool(m["metadata"].get("healed"))) for m in entries]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(MESSAGE, min_size=1, max_size=4), max_size=8), st.booleans(),
       st.sampled_from(["strict", "per_turn"]))
def test_reducer_matches_the_buffer(updates: list[list[Any]], restored: bool,
                                    call_ids: Any) -> None:
    """MEM-1/2/3/10 exactly as ConversationBuffer applies them, under either call-id
    policy; ``restored``: every update starts from a copy of the state (as after a
    checkpoint), so no kept index. Every message has its own id (as a runtime gives).
    Under ``per_turn`` the state is the reducer's own (a state it has not seen is read in
    order, which a heal inside it can make read otherwise: docs/integrations.md)."""
    assume(not (restored and call_ids == "per_turn"))
    state: list[Any] = []
    buffer = flowmem.ConversationBuffer(call_ids=call_ids)
    reducer = flowmem_add_messages(call_ids=call_ids)
    made = 0
    for update in updates:
        copies = []
        for message in update:
            made += 1
            copies.append(message.model_copy(update={"id": f"m{made}"}))
        state = reducer(list(state) if restored else state, copies)
        buffer.append(to_entries(copies))
    assert shape(to_entries(state)) == shape(caller_messages(buffer.messages))


def test_messages_state_uses_the_flowmem_reducer() -> None:
    from flowmem.integrations.langgraph import MessagesState

    builder = StateGraph(MessagesState)
    builder.add_node("tool", lambda state: {"messages": [
        ToolMessage("r", tool_call_id="c1"), ToolMessage("r again", tool_call_id="c1")]})
    builder.add_edge(START, "tool")
    out = builder.compile().invoke({"messages": [
        HumanMessage("q"), AIMessage("", tool_calls=[tool_call("c1", "P")])]})
    assert [m.type for m in out["messages"]] == ["human", "ai", "tool"]


def test_one_state_reduced_twice() -> None:
    """A state reduced again (a branch) after its index moved on is derived anew."""
    base = add_messages([], [HumanMessage("q"), AIMessage("", tool_calls=[tool_call("c1", "P")])])
    first = add_messages(base, [ToolMessage("r", tool_call_id="c1")])
    second = add_messages(base, [HumanMessage("moved on")])
    assert [m.type for m in first] == ["human", "ai", "tool"]
    assert [m.type for m in second] == ["human", "ai", "tool", "human"]
    assert second[2].additional_kwargs == {"healed": True}
    assert add_messages(first, [ToolMessage("again", tool_call_id="c1")]) == first
