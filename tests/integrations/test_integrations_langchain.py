"""LangChain: FlowmemChatMessageHistory (issue #13).

End to end: ``RunnableWithMessageHistory`` over a scripted chat model whose
replies call a tool, and LangChain's agent constructor (``create_agent``).
Mirrored from LangChain's own history tests (langchain-core
``test_chat_history.py`` for ``InMemoryChatMessageHistory``/the base class,
langchain-community ``test_sql.py`` for ``SQLChatMessageHistory``): add and
read back in order, one message and bulk adds, two sessions on one store
kept apart, clear, the async interface, content types kept.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("langchain_core")

from langchain_core.messages import (
    AIMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory

import flowmem
from flowmem.integrations.langchain import (
    FlowmemChatMessageHistory,
    from_entries,
    sendable,
    to_entries,
)
from integrations_support import ScriptedChatModel, openai_problems, tool_call

CTX = flowmem.ExecutionContext(user_id="alice")


def flowmem_agent_state() -> Any:
    """``create_agent``'s state with flowmem's reducer on ``messages``."""
    from typing import Annotated

    from langchain.agents import AgentState
    from langchain_core.messages import AnyMessage

    from flowmem.integrations.langgraph import add_messages

    return type("FlowmemAgentState", (AgentState,), {"__annotations__": {
        "messages": Annotated[list[AnyMessage], add_messages]}})


@pytest.fixture
def memory(tmp_path: Any) -> Any:
    with flowmem.Memory.from_url(f"sqlite:///{tmp_path / 'lc.db'}") as opened:
        yield opened


def history(memory: Any, key: str = "chat") -> FlowmemChatMessageHistory:
    return FlowmemChatMessageHistory(memory, "user", key, context=CTX)


# -- mirrored from LangChain's history tests ----------------------------------

def test_add_and_read_back_in_order(memory: Any) -> None:
    chat = history(memory)
    chat.add_user_message("Hello!")
    chat.add_ai_message("Hi there!")
    chat.add_message(HumanMessage("How are you?"))
    assert [(type(m), m.content) for m in chat.messages] == [
        (HumanMessage, "Hello!"), (AIMessage, "Hi there!"), (HumanMessage, "How are you?")]


def test_bulk_add(memory: Any) -> None:
    chat = history(memory)
    chat.add_messages([HumanMessage("a"), AIMessage("b")])
    chat.add_messages([HumanMessage("c")])
    assert [m.content for m in chat.messages] == ["a", "b", "c"]


def test_two_sessions_on_one_store_are_apart(memory: Any) -> None:
    one, two = history(memory, "one"), history(memory, "two")
    one.add_user_message("for one")
    two.add_ai_message("for two")
    assert [m.content for m in one.messages] == ["for one"]
    assert [m.content for m in two.messages] == ["for two"]
    one.clear()
    assert one.messages == [] and [m.content for m in two.messages] == ["for two"]


def test_clear(memory: Any) -> None:
    chat = history(memory)
    chat.add_messages([HumanMessage("x"), AIMessage("y")])
    chat.clear()
    assert chat.messages == []


def test_async_interface_over_memory_and_async_memory(memory: Any, tmp_path: Any) -> None:
    async def run(chat: FlowmemChatMessageHistory) -> None:
        await chat.aadd_messages([HumanMessage("x"), AIMessage("y")])
        assert [m.content for m in await chat.aget_messages()] == ["x", "y"]
        await chat.aclear()
        assert await chat.aget_messages() == []

    asyncio.run(run(history(memory)))

    async def native() -> None:
        async with flowmem.AsyncMemory.from_url(f"sqlite:///{tmp_path / 'a.db'}") as amem:
            chat = FlowmemChatMessageHistory(amem, "user", "chat", context=CTX)
            await run(chat)
            with pytest.raises(flowmem.SyncCallOnAsyncMemory):
                _ = chat.messages
            with pytest.raises(flowmem.SyncCallOnAsyncMemory):
                chat.add_messages([HumanMessage("no")])

    asyncio.run(native())


def test_messages_round_trip_losslessly(memory: Any) -> None:
    sent = [
        SystemMessage("be brief"),
        HumanMessage([{"type": "text", "text": "what is this?"},
                      {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}}],
                     id="h1", name="alice"),
        AIMessage("", id="a1", tool_calls=[tool_call("c1", "Paris")],
                  additional_kwargs={"refusal": None}, response_metadata={"model_name": "m"},
                  usage_metadata={"input_tokens": 3, "output_tokens": 4, "total_tokens": 7}),
        ToolMessage("sunny", tool_call_id="c1", id="t1", artifact={"raw": [1, 2]},
                    status="success"),
        AIMessage("bad args", invalid_tool_calls=[{"name": "weather", "args": "{oops",
                                                   "id": "c9", "error": "bad",
                                                   "type": "invalid_tool_call"}]),
        ChatMessage("as user", role="user"),
    ]
    assert from_entries(to_entries(sent)) == sent
    chat = FlowmemChatMessageHistory(memory, "user", "rt", context=CTX)
    chat.add_messages(sent)
    assert chat.messages == sent


def test_refused_scope_reads_empty_and_writes_nothing(memory: Any) -> None:
    anon = FlowmemChatMessageHistory(memory, "user", "chat",
                                     context=flowmem.ExecutionContext(user_id=0))
    anon.add_user_message("hi")  # MEM-6/7: refused, nothing stored
    assert anon.messages == []
    assert memory.keys("global", context=None) == []


# -- end to end: RunnableWithMessageHistory with tool calls -------------------

def test_runnable_with_message_history_refire_and_heal(memory: Any) -> None:
    model = ScriptedChatModel(replies=[
        AIMessage("", tool_calls=[tool_call("c1", "Paris")]),
        AIMessage("Sunny in Paris."),
        AIMessage("", tool_calls=[tool_call("c2", "Rome")]),
        AIMessage("Sure, forget Rome."),
    ])
    prompt = ChatPromptTemplate.from_messages([
        ("system", "You answer weather questions."), MessagesPlaceholder("history"),
        MessagesPlaceholder("input")])
    chain = RunnableWithMessageHistory(
        prompt | sendable | model, lambda session_id: history(memory, session_id),
        input_messages_key="input", history_messages_key="history")
    config = {"configurable": {"session_id": "weather"}}

    chain.invoke({"input": [HumanMessage("Weather in Paris?")]}, config)
    result = ToolMessage("sunny", tool_call_id="c1")
    chain.invoke({"input": [result]}, config)
    history(memory, "weather").add_message(result)  # the tool's retry re-fires: MEM-1
    chain.invoke({"input": [HumanMessage("And Rome?")]}, config)  # c2 never answered
    chain.invoke({"input": [HumanMessage("Never mind.")]}, config)

    for sent in model.seen:
        assert openai_problems(sent) == []
    last = model.seen[-1]
    assert [m.tool_call_id for m in last if isinstance(m, ToolMessage)] == ["c1", "c2"]

    stored = memory.history("user", "weather", context=CTX).messages
    assert [m["metadata"].get("tool_call_id") for m in stored if m["role"] == "tool"] == \
        ["c1", "c2"]
    healed = next(m for m in stored if m["metadata"].get("tool_call_id") == "c2")
    assert healed["metadata"]["healed"] is True  # MEM-3, right after its turn
    position = stored.index(healed)
    assert stored[position - 1]["metadata"]["tool_calls"][0]["id"] == "c2"
    assert flowmem.is_sendable(flowmem.normalize(stored).messages)


def test_create_agent_with_history(memory: Any) -> None:
    agents = pytest.importorskip("langchain.agents")
    from langchain_core.tools import tool

    @tool
    def weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    model = ScriptedChatModel(replies=[
        AIMessage("", tool_calls=[tool_call("c1", "Paris")]),
        AIMessage("Sunny in Paris."),
        AIMessage("Bye."),
    ])
    agent = agents.create_agent(model, tools=[weather], state_schema=flowmem_agent_state())
    chat = history(memory, "agent")
    chat.add_messages([HumanMessage("Rome?"), AIMessage("", tool_calls=[tool_call("c0", "Rome")])])
    for question in ("Weather in Paris?", "Thanks!"):  # c0 was interrupted
        before = chat.messages
        out = agent.invoke({"messages": [*before, HumanMessage(question)]})
        chat.add_messages(out["messages"][len(before):])
    for sent in model.seen:
        assert openai_problems(sent) == []
    chat.add_messages([ToolMessage("sunny in Paris", tool_call_id="c1")])  # re-fired: MEM-1
    stored = memory.history("user", "agent", context=CTX).messages
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "user", "assistant",
                                           "tool", "assistant", "user", "assistant"]
    assert stored[2]["metadata"] == {"tool_call_id": "c0", "healed": True,
                                     "langchain": {"type": "tool", "status": "error",
                                                   "additional_kwargs": {"healed": True},
                                                   "id": stored[2]["metadata"]["langchain"]["id"]}}
