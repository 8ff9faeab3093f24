"""The call-id policy in the runtimes whose models reuse call ids (flowmem.call_ids).

Scripted models of LangChain's and LangGraph's own suites reuse ids across turns
(``"1"``, ``"test_call"``; langgraph-prebuilt ``test_react_agent`` and langchain
``create_agent`` tests), as some providers and local models do. A scripted agent
whose model declares call ``"1"`` three times, each with new arguments and a new
message id, runs to its end under flowmem's reducer (its default ``per_turn``
policy), every tool runs and every turn is kept; under ``call_ids="strict"`` the
reducer drops the re-declaring turns (MEM-2 as written).
"""

from __future__ import annotations

import importlib.util
from typing import Annotated, Any

import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.managed import RemainingSteps
from langgraph.prebuilt import create_react_agent
from typing_extensions import TypedDict

import flowmem
from flowmem.integrations.langchain import FlowmemChatMessageHistory
from flowmem.integrations.langgraph import add_messages
from integrations_support import ScriptedChatModel, tool_call

CITIES = ("Paris", "Oslo", "Lima")


def _script() -> list[AIMessage]:
    """Three turns that all call ``"1"`` (new arguments, new message ids), then an answer."""
    return [*(AIMessage("", id=f"ai-{n}", tool_calls=[tool_call("1", city)])
              for n, city in enumerate(CITIES)), AIMessage("all done", id="ai-end")]


def _weather_tool(calls: list[str]) -> Any:
    @tool
    def weather(city: str) -> str:
        """The weather of a city."""
        calls.append(city)
        return f"sunny in {city}"

    return weather


class ReactState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    remaining_steps: RemainingSteps


def _check_every_turn(messages: list[AnyMessage]) -> None:
    kinds = [type(m).__name__ for m in messages]
    assert kinds == ["HumanMessage", *["AIMessage", "ToolMessage"] * 3, "AIMessage"]
    results = [m for m in messages if isinstance(m, ToolMessage)]
    assert [m.tool_call_id for m in results] == ["1", "1", "1"]
    assert [m.content for m in results] == [f"sunny in {c}" for c in CITIES]
    assert messages[-1].content == "all done"


def test_react_agent_reusing_call_ids_completes_and_keeps_every_turn(figure: Any) -> None:
    calls: list[str] = []
    model = ScriptedChatModel(replies=_script())
    with pytest.warns(DeprecationWarning):  # moved to langchain.agents (tested below too)
        agent = create_react_agent(model, [_weather_tool(calls)], state_schema=ReactState)
    out = agent.invoke({"messages": [HumanMessage("weather?", id="h")]},
                       {"recursion_limit": 12})  # a loop would raise GraphRecursionError
    _check_every_turn(out["messages"])
    assert calls == list(CITIES)
    assert len(model.seen) == 4
    figure(f"react agent reusing call id '1': {len(out['messages'])} messages kept, "
           f"{len(calls)} tool runs, {len(model.seen)} model calls")


@pytest.mark.skipif(importlib.util.find_spec("langchain") is None
                    or importlib.util.find_spec("langchain.agents") is None,
                    reason="langchain's create_agent is not installed")
def test_langchain_create_agent_reusing_call_ids_keeps_every_turn() -> None:
    from langchain.agents import AgentState, create_agent

    class State(AgentState):  # type: ignore[type-arg, misc]
        messages: Annotated[list[AnyMessage], add_messages]  # type: ignore[misc]

    calls: list[str] = []
    agent = create_agent(ScriptedChatModel(replies=_script()), [_weather_tool(calls)],
                         state_schema=State)
    out = agent.invoke({"messages": [HumanMessage("weather?", id="h")]},
                       {"recursion_limit": 12})
    _check_every_turn(out["messages"])
    assert calls == list(CITIES)


def test_the_strict_reducer_drops_a_re_declaring_turn_and_per_turn_keeps_copies_out() -> None:
    first = [HumanMessage("q", id="h"), AIMessage("", id="a1", tool_calls=[tool_call("1", "A")]),
             ToolMessage("r", tool_call_id="1", id="t1")]
    again = AIMessage("", id="a2", tool_calls=[tool_call("1", "B")])
    strict = add_messages(call_ids="strict")
    assert [m.id for m in strict(first, [again])] == ["h", "a1", "t1"]  # MEM-2 as written
    per_turn = add_messages(first, [again])
    assert [m.id for m in per_turn] == ["h", "a1", "t1", "a2"]
    # a result pairs with the newest declaration; a re-fired one is dropped (MEM-1)
    answered = add_messages(per_turn, [ToolMessage("r2", tool_call_id="1", id="t2")])
    assert [m.id for m in answered][-1] == "t2"
    assert add_messages(answered, [ToolMessage("r3", tool_call_id="1", id="t3")]) == answered
    # a copy of a re-declaration stays a MEM-2 duplicate
    assert add_messages(answered, [AIMessage("", id="a2", tool_calls=[tool_call("1", "B")])]
                        ) == answered
    # before the next human turn an unanswered re-declaration is healed, with the caller's id
    third = add_messages(answered, [AIMessage("", id="a3", tool_calls=[tool_call("1", "C")]),
                                    HumanMessage("next", id="h2")])
    healed = third[-2]
    assert isinstance(healed, ToolMessage) and healed.tool_call_id == "1"
    assert healed.additional_kwargs.get("healed") is True
    # a late result replaces the placeholder of the id's NEWEST declaration (MEM-10), and a
    # second one is a duplicate of it (MEM-1)
    late = add_messages(third, [ToolMessage("late", tool_call_id="1", id="t4")])
    assert [m.id for m in late] == [m.id for m in third[:-2]] + ["t4", "h2"]
    assert add_messages(late, [ToolMessage("later", tool_call_id="1", id="t5")]) == late


def test_langchain_history_defaults_to_per_turn_and_says_so(tmp_path: Any) -> None:
    memory = flowmem.Memory.from_url(f"sqlite:///{tmp_path / 'h.db'}")
    context = flowmem.ExecutionContext(workflow_id="w")
    history = FlowmemChatMessageHistory(memory, "workflow", "chat", context=context)
    assert history.memory.call_ids == "per_turn" and memory.call_ids == "strict"
    for n, city in enumerate(CITIES):
        history.add_messages([AIMessage("", id=f"a{n}", tool_calls=[tool_call("1", city)]),
                              ToolMessage(city, tool_call_id="1", id=f"t{n}")])
    history.add_messages([AIMessage("", id="a1", tool_calls=[tool_call("1", "Oslo")])])  # a copy
    stored = history.messages
    assert [m.id for m in stored] == ["a0", "t0", "a1", "t1", "a2", "t2"]
    assert {m.tool_call_id for m in stored if isinstance(m, ToolMessage)} == {"1"}
    strict = FlowmemChatMessageHistory(memory, "workflow", "strict", context=context,
                                       call_ids="strict")
    for n, city in enumerate(CITIES):
        strict.add_messages([AIMessage("", id=f"a{n}", tool_calls=[tool_call("1", city)]),
                             ToolMessage(city, tool_call_id="1", id=f"t{n}")])
    assert [m.id for m in strict.messages] == ["a0", "t0"]
    memory.close()
