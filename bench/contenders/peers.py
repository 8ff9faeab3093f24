"""The peers: what users would otherwise pick, each at its own default durability.

None of them deduplicates re-fired results or heals interrupted calls. LangChain
and LangGraph hold LangChain message objects, converted from the OpenAI dicts by
``convert_to_messages`` outside the timed region and back by
``convert_to_openai_messages`` for the sendability count; ``add_messages``
merges by message ``id`` only, so a re-fired result (a new object, a new id) is
kept. The Agents SDK holds Responses items: a chat assistant turn declaring
calls becomes one ``function_call`` item per call (plus a message when it has
text), a tool result a ``function_call_output``; the SDK's own converter turns
them back into chat messages. Each class's ``notes`` say the rest.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .base import Contender
from .baselines import DEFAULTS


class _LangChainTypes(Contender):
    def convert(self, messages: Sequence[dict[str, Any]]) -> list[Any]:
        from langchain_core.messages import convert_to_messages

        return list(convert_to_messages([dict(m) for m in messages]))

    def to_openai(self, history: Any) -> list[dict[str, Any]]:
        from langchain_core.messages import convert_to_openai_messages

        return list(convert_to_openai_messages(list(history)))


class LangGraphAddMessages(_LangChainTypes):
    name = "langgraph-add-messages"
    label = "LangGraph add_messages (in memory)"
    durability = "none (in process)"
    persistent = False
    reference = "flowmem-memory"
    notes = ("`state = add_messages(state, [message])` per append: the reducer converts and "
             "indexes the whole list and returns a new one, so its cost grows with the length.")
    needs = ("langgraph", "langchain_core")

    def open(self, workdir: Path, *, bulk: bool = False) -> None:
        from langgraph.graph.message import add_messages

        super().open(workdir)
        self.add = add_messages
        self.states: dict[str, list[Any]] = {}

    def prefill(self, conversation: str, items: Sequence[Any]) -> None:
        self.states[conversation] = self.add(self.states.get(conversation, []), list(items))

    def append(self, conversation: str, item: Any) -> None:
        self.states[conversation] = self.add(self.states.get(conversation, []), [item])

    def read_all(self, conversation: str) -> Any:
        return list(self.states[conversation])

    def read_last(self, conversation: str, n: int) -> Any:
        return self.states[conversation][-n:]


class LangGraphSqliteSaver(_LangChainTypes):
    name = "langgraph-sqlitesaver"
    label = "LangGraph StateGraph + SqliteSaver"
    durability = "WAL (set by SqliteSaver.setup), synchronous=FULL (SQLite's default)"
    max_length = 10_000
    max_length_reason = ("one append there takes seconds (each invoke re-serializes the whole "
                         "list into three new checkpoints) and the curve is plain by 10,000; "
                         "it would add minutes to the run")
    notes = ("One no-op node, one `invoke` per appended message (default durability "
             "`\"async\"`); each invoke writes new checkpoints holding the whole list. "
             "Prefilled with ONE invoke carrying the whole prefix. Reads through "
             "`get_state`; no way to read only the last 50.")
    needs = ("langgraph", "langgraph.checkpoint.sqlite", "langchain_core")

    def open(self, workdir: Path, *, bulk: bool = False) -> None:
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.graph import END, START, MessagesState, StateGraph

        super().open(workdir)
        self.conn = sqlite3.connect(str(workdir / "langgraph.db"), check_same_thread=False)
        builder = StateGraph(MessagesState)
        builder.add_node("agent", lambda state: {})
        builder.add_edge(START, "agent")
        builder.add_edge("agent", END)
        self.graph = builder.compile(checkpointer=SqliteSaver(self.conn))

    def prefill(self, conversation: str, items: Sequence[Any]) -> None:
        self.graph.invoke({"messages": list(items)}, {"configurable": {"thread_id": conversation}})

    def append(self, conversation: str, item: Any) -> None:
        self.graph.invoke({"messages": [item]}, {"configurable": {"thread_id": conversation}})

    def read_all(self, conversation: str) -> Any:
        return self.graph.get_state({"configurable": {"thread_id": conversation}}
                                    ).values["messages"]

    def close(self) -> None:
        self.conn.close()


class LangChainSQL(_LangChainTypes):
    name = "langchain-sql"
    label = "LangChain SQLChatMessageHistory (SQLite)"
    durability = DEFAULTS
    notes = ("SQLAlchemy session + commit per `add_message`; no last-N read, so the last "
             "50 cost a full read.")
    needs = ("langchain_community", "sqlalchemy", "greenlet", "langchain_core")

    def open(self, workdir: Path, *, bulk: bool = False) -> None:
        from sqlalchemy import create_engine

        super().open(workdir)
        self.engine = create_engine(f"sqlite:///{workdir / 'langchain.db'}")
        self.histories: dict[str, Any] = {}

    def _history(self, conversation: str) -> Any:
        history = self.histories.get(conversation)
        if history is None:
            from langchain_community.chat_message_histories import SQLChatMessageHistory

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                history = SQLChatMessageHistory(session_id=conversation, connection=self.engine)
            self.histories[conversation] = history
        return history

    def prefill(self, conversation: str, items: Sequence[Any]) -> None:
        self._history(conversation).add_messages(list(items))

    def append(self, conversation: str, item: Any) -> None:
        self._history(conversation).add_message(item)

    def read_all(self, conversation: str) -> Any:
        return self._history(conversation).messages

    def close(self) -> None:
        for history in self.histories.values():
            history.session_maker.remove()
        self.engine.dispose()


def chat_to_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    """One OpenAI Chat message to the Responses input items it becomes."""
    if message["role"] == "tool":
        return [{"type": "function_call_output", "call_id": message["tool_call_id"],
                 "output": message.get("content") or ""}]
    items: list[dict[str, Any]] = []
    if message.get("content"):
        items.append({"role": message["role"], "content": message["content"]})
    for call in message.get("tool_calls") or ():
        items.append({"type": "function_call", "call_id": call["id"],
                      "name": call["function"]["name"],
                      "arguments": call["function"]["arguments"]})
    return items


class AgentsSQLiteSession(Contender):
    name = "agents-sqlitesession"
    label = "OpenAI Agents SDK SQLiteSession"
    durability = "WAL (set by SQLiteSession), synchronous=FULL (SQLite's default)"
    notes = ("Async API: each `add_items` runs its insert in a worker thread "
             "(`asyncio.to_thread`); the timed loop runs inside one event loop. "
             "An assistant turn with 3 calls is one `add_items` of 3 items.")
    needs = ("agents",)

    def convert(self, messages: Sequence[dict[str, Any]]) -> list[Any]:
        return [chat_to_items(m) for m in messages]

    def open(self, workdir: Path, *, bulk: bool = False) -> None:
        super().open(workdir)
        self.loop = asyncio.new_event_loop()
        self.sessions: dict[str, Any] = {}

    def _session(self, conversation: str) -> Any:
        if conversation not in self.sessions:
            from agents import SQLiteSession

            self.sessions[conversation] = SQLiteSession(conversation,
                                                        str(self.workdir / "agents.db"))
        return self.sessions[conversation]

    def prefill(self, conversation: str, items: Sequence[Any]) -> None:
        flat = [item for group in items for item in group]
        self.loop.run_until_complete(self._session(conversation).add_items(flat))

    def append(self, conversation: str, item: Any) -> None:
        self.loop.run_until_complete(self._session(conversation).add_items(item))

    def timed_appends(self, conversation: str, items: Sequence[Any]) -> int:
        session = self._session(conversation)  # inside one event loop, as an agent would

        async def run() -> int:
            start = time.perf_counter_ns()
            for item in items:
                await session.add_items(item)
            return time.perf_counter_ns() - start

        return self.loop.run_until_complete(run())

    def read_all(self, conversation: str) -> Any:
        return self.loop.run_until_complete(self._session(conversation).get_items())

    def read_last(self, conversation: str, n: int) -> Any:
        return self.loop.run_until_complete(self._session(conversation).get_items(limit=n))

    def to_openai(self, history: Any) -> list[dict[str, Any]]:
        from agents.models.chatcmpl_converter import Converter  # what the SDK itself sends

        return [dict(message) for message in Converter.items_to_messages(history)]

    def close(self) -> None:
        for session in self.sessions.values():
            session.close()
        self.loop.close()
