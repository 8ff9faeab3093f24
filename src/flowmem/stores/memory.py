"""``memory://`` — the in-process store, built on :class:`~flowmem.ConversationBuffer`.

A real backend (not a mock): the same plans, the same window, the same
conformance suite as the database stores. Nothing survives the process.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Final

from .._frozen import quick_new
from ..buffer import ConversationBuffer
from ..errors import IdempotencyConflict, KeyConflict
from ..messages import Message, json_copy
from ..plan import plan_append
from ..scopes import StorageKey
from ..store import AppendOutcome, HistoryPage, Idempotency, plan_stats
from .locks import KeyLocks, stripe_of

__all__ = ["InMemoryStore"]


_NO_BUFFER: Final = (None, None)
_new_outcome = quick_new(AppendOutcome)


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
        self._hot: tuple[StorageKey | None, threading.Lock] = (None, threading.Lock())
        self._keys: dict[str, tuple[str, Any, float]] = {}  # idempotency key -> record
        # the last appended key's buffer; forgotten whenever a key's holding is replaced
        self._last_buffer: tuple[StorageKey | None, ConversationBuffer | None] = _NO_BUFFER

    def read(self, key: StorageKey) -> tuple[bool, Any]:
        with self._mutex:
            held = self._data.get(key)
            if held is None:
                return False, None
            if isinstance(held, ConversationBuffer):
                return True, held.messages
            return True, json_copy(held.value)

    def write(self, key: StorageKey, value: Any, *,
              idempotency: Idempotency | None = None) -> None:
        copied = json_copy(value)
        with self._mutex:
            if self._replay(idempotency) is None:
                self._last_buffer = _NO_BUFFER
                self._data[key] = _Value(copied)
                self._record(idempotency, True)

    def delete(self, key: StorageKey, *, idempotency: Idempotency | None = None) -> bool:
        with self._mutex:
            first = self._replay(idempotency)
            if first is not None:
                return bool(first)
            self._last_buffer = _NO_BUFFER
            found = self._data.pop(key, None) is not None
            self._record(idempotency, found)
            return found

    def _replay(self, idempotency: Idempotency | None) -> Any:
        """The outcome recorded under the key, or ``None`` (call under the mutex)."""
        if idempotency is None:
            return None
        held = self._keys.get(idempotency.key)
        if held is None or held[2] < idempotency.now:
            return None
        if held[0] != idempotency.fingerprint:
            raise IdempotencyConflict(f"idempotency key {idempotency.key!r} was used for a "
                                      "different request; a retry must repeat it exactly")
        return held[1]

    def _record(self, idempotency: Idempotency | None, outcome: Any) -> None:
        if idempotency is not None:
            if len(self._keys) % 64 == 0:
                self._keys = {k: r for k, r in self._keys.items() if r[2] >= idempotency.now}
            self._keys[idempotency.key] = (idempotency.fingerprint, outcome,
                                           idempotency.now + idempotency.ttl)

    def append(self, key: StorageKey, incoming: Sequence[Message], *,
               max_messages: int | None, lock_timeout: float,
               idempotency: Idempotency | None = None, tail: int = 0) -> AppendOutcome:
        # the MEM-12 lock without a lock file is one thread lock: taken directly
        hot = self._hot
        if hot[0] is key:  # the same (frozen) key as the last append: the same lock
            lock = hot[1]
        else:
            lock = self._locks.thread_lock(stripe_of(key))
            self._hot = (key, lock)
        if not lock.acquire(True, lock_timeout if lock_timeout > 0.0 else 0.0):
            return self._apply(key, incoming, max_messages, False, idempotency, tail)
        try:
            return self._apply(key, incoming, max_messages, True, idempotency, tail)
        finally:
            lock.release()

    def apply_append(self, key: StorageKey, incoming: Sequence[Message], *,
                     max_messages: int | None, serialized: bool = True,
                     idempotency: Idempotency | None = None, tail: int = 0) -> AppendOutcome:
        """The append's atomic step, for a caller that already waited for the MEM-12 lock."""
        return self._apply(key, incoming, max_messages, serialized, idempotency, tail)

    def _apply(self, key: StorageKey, incoming: Sequence[Message], max_messages: int | None,
               serialized: bool, idempotency: Idempotency | None,
               tail: int = 0) -> AppendOutcome:
        with self._mutex:
            if idempotency is not None:
                first = self._replay(idempotency)
                if first is not None:
                    page = self._page(self._buffer(key, create=False), tail, None) if tail else None
                    return AppendOutcome(first[0], first[1], serialized, replayed=True,
                                         tail=page)
            last, buffer = self._last_buffer  # the same (frozen) key's: no StorageKey hash
            if last is not key or buffer is None:
                buffer = self._buffer(key, create=True)
                assert buffer is not None
                self._last_buffer = (key, buffer)
            plan = plan_append(buffer.view(incoming), incoming)
            count = buffer.apply(plan, max_messages=max_messages)
            if idempotency is not None:
                self._record(idempotency, (count, plan.appended))
            if tail:
                return AppendOutcome(count, plan.appended, serialized, plan_stats(plan),
                                     tail=self._page(buffer, tail, None))
            return _new_outcome(count, plan.appended, serialized, plan_stats(plan))

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
            return self._page(self._buffer(key, create=False), last, before)

    @staticmethod
    def _page(buffer: ConversationBuffer | None, last: int | None,
              before: int | None) -> HistoryPage:
        """A page of ``buffer`` (``None``: no conversation), under the mutex."""
        if buffer is None:
            return HistoryPage(total=0)
        messages, positions = buffer.page(last=last, before=before)
        older = bool(positions) and buffer.page(last=1, before=positions[0])[1] != []
        return HistoryPage(messages, positions, positions[0] if older else None,
                           buffer.count_before(before))

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
            self._last_buffer = _NO_BUFFER
            self._data.clear()
