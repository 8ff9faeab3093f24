"""LangGraph: the ``add_messages`` reducer in memory, and ``StateGraph(MessagesState)``
with a ``SqliteSaver`` checkpointer.

Messages are LangChain message objects, converted from the OpenAI dicts by
``langchain_core.messages.convert_to_messages`` outside the timed region, and
back by ``convert_to_openai_messages`` for the sendability count.

``add_messages`` merges by message ``id`` only: re-fired tool results are new
message objects with new ids, so they are kept, and interrupted calls are
left dangling (a caller could give results deterministic ids so that a
re-fire replaces the first copy; that is not the default).

The graph is one no-op node; one ``invoke({"messages": [message]})`` per
appended message, with LangGraph's default durability (``"async"``: the
checkpoint writes still finish before ``invoke`` returns). Every invoke
writes checkpoints holding the WHOLE message list, so its cost and the
database grow with the conversation. Prefill: one ``invoke`` with the whole
prefix, one set of checkpoints instead of one per message.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .base import Contender, missing_modules

__all__ = ["LangGraphAddMessages", "LangGraphSqliteSaver", "from_langchain", "to_langchain"]


def to_langchain(messages: Sequence[dict[str, Any]]) -> list[Any]:
    from langchain_core.messages import convert_to_messages

    return list(convert_to_messages([dict(m) for m in messages]))


def from_langchain(messages: Sequence[Any]) -> list[dict[str, Any]]:
    from langchain_core.messages import convert_to_openai_messages

    return list(convert_to_openai_messages(list(messages)))


class LangGraphAddMessages(Contender):
    name = "langgraph-add-messages"
    label = "LangGraph add_messages (in memory)"
    durability = "none (in process)"
    persistent = False
    reference = "flowmem-memory"
    notes = ("`state = add_messages(state, [message])` per append: the reducer converts and "
             "indexes the whole list and returns a new one, so its cost grows with the length.")

    @classmethod
    def unavailable(cls) -> str | None:
        return missing_modules("langgraph", "langchain_core")

    def convert(self, messages: Sequence[dict[str, Any]]) -> list[Any]:
        return to_langchain(messages)

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

    def to_openai(self, history: Any) -> list[dict[str, Any]]:
        return from_langchain(history)


class LangGraphSqliteSaver(Contender):
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

    @classmethod
    def unavailable(cls) -> str | None:
        return missing_modules("langgraph", "langgraph.checkpoint.sqlite", "langchain_core")

    def convert(self, messages: Sequence[dict[str, Any]]) -> list[Any]:
        return to_langchain(messages)

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

    @staticmethod
    def _config(conversation: str) -> Any:
        return {"configurable": {"thread_id": conversation}}

    def prefill(self, conversation: str, items: Sequence[Any]) -> None:
        self.graph.invoke({"messages": list(items)}, self._config(conversation))

    def append(self, conversation: str, item: Any) -> None:
        self.graph.invoke({"messages": [item]}, self._config(conversation))

    def read_all(self, conversation: str) -> Any:
        return self.graph.get_state(self._config(conversation)).values["messages"]

    def read_last(self, conversation: str, n: int) -> Any:
        return self.graph.get_state(self._config(conversation)).values["messages"][-n:]

    def to_openai(self, history: Any) -> list[dict[str, Any]]:
        return from_langchain(history)

    def write_stats(self, conversation: str) -> dict[str, int]:
        """Checkpoint rows and bytes of one thread: what one invoke adds, and the last blob."""
        rows = self.conn.execute(
            "SELECT count(*), coalesce(sum(length(checkpoint)), 0) FROM checkpoints "
            "WHERE thread_id = ?", (conversation,)).fetchone()
        last = self.conn.execute(
            "SELECT length(checkpoint) FROM checkpoints WHERE thread_id = ? "
            "ORDER BY rowid DESC LIMIT 1", (conversation,)).fetchone()
        writes = self.conn.execute(
            "SELECT count(*), coalesce(sum(length(value)), 0) FROM writes WHERE thread_id = ?",
            (conversation,)).fetchone()
        return {"checkpoints": int(rows[0]), "checkpoint_bytes": int(rows[1]),
                "last_checkpoint_bytes": int(last[0]) if last else 0,
                "writes": int(writes[0]), "write_bytes": int(writes[1])}

    def close(self) -> None:
        self.conn.close()
