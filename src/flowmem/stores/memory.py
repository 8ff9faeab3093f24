"""``memory://`` — the in-process store, built on :class:`~flowmem.ConversationBuffer`.

A real backend (not a mock): the same plans, the same window, the same
conformance suite as the database stores. Nothing survives the process.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from ..buffer import ConversationBuffer
from ..errors import KeyConflict
from ..messages import Message, json_copy
from ..plan import plan_append
from ..scopes import StorageKey
from ..store import AppendOutcome, HistoryPage
from .locks import KeyLocks

__all__ = ["InMemoryStore"]


class _Value:
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class InMemoryStore:
    """Values and conversations in a dict; thread-safe; per-key MEM-12 locks."""

    def __init__(self) -> None:
        self._data: dict[StorageKey, _Value | ConversationBuffer] = {}
        self._mutex = threading.RLock()  # the store's own atomicity, held briefly
        self._locks = KeyLocks()

    def read(self, key: StorageKey) -> tuple[bool, Any]:
        with self._mutex:
            held = self._data.get(key)
            if held is None:
                return False, None
            if isinstance(held, ConversationBuffer):
                return True, held.messages
            return True, json_copy(held.value)

    def write(self, key: StorageKey, value: Any) -> None:
        copied = json_copy(value)
        with self._mutex:
            self._data[key] = _Value(copied)

    def delete(self, key: StorageKey) -> bool:
        with self._mutex:
            return self._data.pop(key, None) is not None

    def append(self, key: StorageKey, incoming: Sequence[Message], *,
               max_messages: int | None, lock_timeout: float) -> AppendOutcome:
        with self._locks.hold(key, lock_timeout) as serialized:
            return self.apply_append(key, incoming, max_messages=max_messages,
                                     serialized=serialized)

    def apply_append(self, key: StorageKey, incoming: Sequence[Message], *,
                     max_messages: int | None, serialized: bool = True) -> AppendOutcome:
        """The append's atomic step, for a caller that already waited for the MEM-12 lock."""
        with self._mutex:
            buffer = self._buffer(key, create=True)
            assert buffer is not None
            plan = plan_append(buffer.view(incoming), incoming)
            buffer.apply(plan, max_messages=max_messages)
            return AppendOutcome(len(buffer), plan.appended, serialized)

    def _buffer(self, key: StorageKey, *, create: bool) -> ConversationBuffer | None:
        held = self._data.get(key)
        if isinstance(held, _Value):
            raise KeyConflict(f"key {key.key!r} holds a plain value, not a conversation")
        if held is None and create:
            held = self._data[key] = ConversationBuffer()
        return held

    def history(self, key: StorageKey, *, last: int | None = None,
                before: int | None = None) -> HistoryPage:
        with self._mutex:
            buffer = self._buffer(key, create=False)
            if buffer is None:
                return HistoryPage()
            messages, positions = buffer.page(last=last, before=before)
            older = bool(positions) and buffer.page(last=1, before=positions[0])[1] != []
            return HistoryPage(messages, positions, positions[0] if older else None)

    def edit(self, key: StorageKey, position: int, message: Message | None) -> bool:
        with self._mutex:
            buffer = self._buffer(key, create=False)
            return buffer is not None and buffer.edit(position, message)

    def keys(self, scope: str, scope_id: str, *, prefix: str = "",
             after: str | None = None, limit: int = 100) -> list[str]:
        with self._mutex:
            found = sorted(k.key for k in self._data
                           if k.scope == scope and k.scope_id == scope_id
                           and k.key.startswith(prefix) and (after is None or k.key > after))
        return found[:limit]

    def lock(self, key: StorageKey, timeout: float) -> AbstractContextManager[bool]:
        return self._locks.hold(key, timeout)

    def close(self) -> None:
        with self._mutex:
            self._data.clear()
