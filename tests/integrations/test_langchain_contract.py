"""FlowmemChatMessageHistory against LangChain's ``BaseChatMessageHistory`` contract.

Written by us from the ``BaseChatMessageHistory`` docs and langchain-core's
own tests (``tests/unit_tests/chat_history/test_chat_history.py``), whose
names each test cites: ``add_message`` and ``add_messages`` append in order,
``messages`` reads them back, ``clear`` empties, the async methods mirror the
sync ones; messages come back as they were added (ids, kwargs, metadata).
flowmem differs by design where the rules apply: a re-fired ``ToolMessage``
is stored once (MEM-1), a call left without result is healed at the next
human turn (MEM-3), and a rendering for a provider puts system messages
first (MEM-5) while the history keeps the order they were added in.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langchain_core")

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    message_to_dict,
)

import flowmem
from flowmem.formats import render
from flowmem.integrations.langchain import FlowmemChatMessageHistory

CONTEXT = flowmem.ExecutionContext(user_id="alice")


@pytest.fixture
def history(tmp_path: Path) -> FlowmemChatMessageHistory:
    memory = flowmem.Memory.from_url(f"sqlite:///{tmp_path / 'chat.db'}")
    return FlowmemChatMessageHistory(memory, "user", "chat", context=CONTEXT)


def test_is_a_chat_message_history(history: FlowmemChatMessageHistory) -> None:
    assert isinstance(history, BaseChatMessageHistory)


def test_add_message_and_add_messages_append_in_order(
        history: FlowmemChatMessageHistory) -> None:
    """``test_add_message_implementation_only``, ``test_bulk_message_implementation_only``
    (and the ``add_user_message`` / ``add_ai_message`` conveniences)."""
    history.add_message(HumanMessage("Hello", id="h1"))
    history.add_message(HumanMessage("World", id="h2"))
    history.add_messages([HumanMessage("Hello", id="h3"), HumanMessage("World", id="h4")])
    history.add_user_message("user says")
    history.add_ai_message("ai says")
    assert [(m.type, m.content) for m in history.messages] == [
        ("human", "Hello"), ("human", "World"), ("human", "Hello"), ("human", "World"),
        ("human", "user says"), ("ai", "ai says")]
    history.clear()
    assert history.messages == []


def test_async_interface(tmp_path: Path) -> None:
    """``test_async_interface``: ``aadd_messages``, ``aget_messages``, ``aclear`` over an
    AsyncMemory, natively."""
    memory = flowmem.AsyncMemory.from_url(f"sqlite:///{tmp_path / 'achat.db'}")
    history = FlowmemChatMessageHistory(memory, "user", "chat", context=CONTEXT)

    async def go() -> None:
        await history.aadd_messages([HumanMessage("Hello", id="1"), AIMessage("Hi", id="2")])
        assert [m.content for m in await history.aget_messages()] == ["Hello", "Hi"]
        await history.aclear()
        assert await history.aget_messages() == []
        await memory.aclose()

    asyncio.run(go())


def test_messages_come_back_as_added(history: FlowmemChatMessageHistory) -> None:
    """What LangChain's own serialization keeps (``message_to_dict``) is kept."""
    added = [
        SystemMessage("Be brief.", id="s1", name="policy"),
        HumanMessage([{"type": "text", "text": "Look"},
                      {"type": "image_url", "image_url": {"url": "https://e.org/a.png"}}],
                     id="h1", additional_kwargs={"k": 1}),
        AIMessage("", id="a1", tool_calls=[{"name": "f", "args": {"x": 1}, "id": "c1",
                                            "type": "tool_call"}],
                  response_metadata={"model": "m"},
                  usage_metadata={"input_tokens": 1, "output_tokens": 2, "total_tokens": 3}),
        ToolMessage("ok", tool_call_id="c1", id="t1", status="success", artifact={"n": 1}),
    ]
    history.add_messages(added)
    assert [message_to_dict(m) for m in history.messages] == [message_to_dict(m)
                                                               for m in added]


def test_differs_by_design_refired_result_and_healing(
        history: FlowmemChatMessageHistory) -> None:
    """A re-fired result is stored once (MEM-1); an open call is healed right after
    its turn when the next human message is added (MEM-3)."""
    call = {"name": "f", "args": {}, "id": "c1", "type": "tool_call"}
    history.add_messages([HumanMessage("go"), AIMessage("", tool_calls=[call])])
    history.add_messages([AIMessage("", tool_calls=[{**call, "id": "c2"}]),
                          ToolMessage("ok", tool_call_id="c2")])
    history.add_message(ToolMessage("ok", tool_call_id="c2"))
    history.add_message(HumanMessage("next"))
    kinds = [(m.type, getattr(m, "tool_call_id", None)) for m in history.messages]
    assert kinds == [("human", None), ("ai", None), ("tool", "c1"), ("ai", None),
                     ("tool", "c2"), ("human", None)]


def test_differs_by_design_system_first_on_render(history: FlowmemChatMessageHistory) -> None:
    """The history keeps the order messages were added in; a rendering for a
    provider puts system messages first (MEM-5 step 2)."""
    history.add_messages([HumanMessage("hi"), SystemMessage("Be brief.")])
    assert [m.type for m in history.messages] == ["human", "system"]
    stored: Any = history.memory.history("user", "chat", context=CONTEXT).messages
    assert [m["role"] for m in render(stored, "openai").output] == ["system", "user"]
