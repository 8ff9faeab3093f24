"""The OpenAI Agents SDK ``SQLiteSession`` (``agents.memory``), driven with asyncio.

Items are Responses API input items: a chat assistant turn declaring calls
becomes one ``function_call`` item per call (plus an assistant message when
it has text), a tool result a ``function_call_output``. One appended chat
message is one ``add_items`` call (one commit, the calls of a turn
together). No API key is needed: the session is a local SQLite file.

``SQLiteSession`` sets ``journal_mode=WAL`` and leaves ``synchronous`` at
SQLite's default, FULL. Each call hops to a worker thread
(``asyncio.to_thread``). ``get_items(limit=50)`` reads the last 50.
Nothing deduplicates re-fired outputs or heals interrupted calls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .base import Contender, missing_modules

__all__ = ["AgentsSQLiteSession", "chat_to_items", "items_to_chat"]


def chat_to_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    """One OpenAI Chat message to the Responses input items it becomes."""
    role = message["role"]
    if role == "tool":
        return [{"type": "function_call_output", "call_id": message["tool_call_id"],
                 "output": message.get("content") or ""}]
    items: list[dict[str, Any]] = []
    if message.get("content"):
        items.append({"role": role, "content": message["content"]})
    for call in message.get("tool_calls") or ():
        items.append({"type": "function_call", "call_id": call["id"],
                      "name": call["function"]["name"],
                      "arguments": call["function"]["arguments"]})
    return items


def items_to_chat(items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses input items back to OpenAI Chat dicts (consecutive calls make one turn)."""
    out: list[dict[str, Any]] = []
    for item in items:
        kind = item.get("type")
        if kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item["call_id"],
                        "content": item.get("output", "")})
        else:
            out.append({"role": item["role"], "content": item.get("content", "")})
    return out


class AgentsSQLiteSession(Contender):
    name = "agents-sqlitesession"
    label = "OpenAI Agents SDK SQLiteSession"
    durability = "WAL (set by SQLiteSession), synchronous=FULL (SQLite's default)"
    notes = ("Async API: each `add_items` runs its insert in a worker thread "
             "(`asyncio.to_thread`); the timed loop runs inside one event loop. "
             "An assistant turn with 3 calls is one `add_items` of 3 items.")

    @classmethod
    def unavailable(cls) -> str | None:
        return missing_modules("agents")

    def convert(self, messages: Sequence[dict[str, Any]]) -> list[Any]:
        return [chat_to_items(m) for m in messages]

    def open(self, workdir: Path, *, bulk: bool = False) -> None:
        super().open(workdir)
        self.loop = asyncio.new_event_loop()
        self.sessions: dict[str, Any] = {}

    def _session(self, conversation: str) -> Any:
        session = self.sessions.get(conversation)
        if session is None:
            from agents import SQLiteSession

            session = SQLiteSession(conversation, str(self.workdir / "agents.db"))
            self.sessions[conversation] = session
        return session

    def prefill(self, conversation: str, items: Sequence[Any]) -> None:
        flat = [item for group in items for item in group]
        self.loop.run_until_complete(self._session(conversation).add_items(flat))

    def append(self, conversation: str, item: Any) -> None:
        self.loop.run_until_complete(self._session(conversation).add_items(item))

    def timed_appends(self, conversation: str, items: Sequence[Any]) -> int:
        session = self._session(conversation)

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
        return items_to_chat(history)

    def close(self) -> None:
        for session in self.sessions.values():
            session.close()
        self.loop.close()
