"""The messages and keys the conformance tests build."""

from __future__ import annotations

import uuid

from ..messages import Message
from ..scopes import StorageKey

__all__ = ["assistant", "fresh_key", "tool", "user"]


def fresh_key(scope: str = "workflow", name: str = "conv") -> StorageKey:
    """A storage key no other test uses."""
    return StorageKey(scope, f"t-{uuid.uuid4().hex}", name)


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def assistant(*ids: str, spelling: str = "id") -> Message:
    calls = [{spelling: i, "type": "function", "function": {"name": "f", "arguments": "{}"}}
             for i in ids]
    return {"role": "assistant", "content": None, "tool_calls": calls}


def tool(call: str, content: str = "ok", *, healed: bool = False) -> Message:
    message: Message = {"role": "tool", "tool_call_id": call, "content": content}
    if healed:
        message["metadata"] = {"healed": True}
    return message
