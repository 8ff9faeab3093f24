"""Helpers for the SQLite store's tests: one conversation's key and the messages they
append (a turn declaring calls, a result, a user turn)."""

from __future__ import annotations

from flowmem.messages import Message
from flowmem.scopes import StorageKey

KEY = StorageKey("session", "s1", "chat")


def call(*ids: str) -> Message:
    """An assistant turn declaring ``ids`` (OpenAI's flat spelling)."""
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": i, "type": "function",
                            "function": {"name": "f", "arguments": "{}"}} for i in ids]}


def result(call_id: str, content: str = "ok") -> Message:
    """The result of ``call_id``."""
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def user(text: str = "next") -> Message:
    return {"role": "user", "content": text}
