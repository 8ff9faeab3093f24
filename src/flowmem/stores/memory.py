"""``memory://`` — the in-process store, built on :class:`~flowmem.ConversationBuffer`.

A real backend (not a mock): the same plans, the same window, the same
conformance suite as the database stores. Nothing survives the process.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, Final

from .._frozen import quick_new
from ..buffer import ConversationBuffer
from ..errors import IdempotencyConflict, KeyConflict
from ..messages import Message, json_copy
from ..plan import plan_append
from ..retention import Expiry, Swept, expired
from ..scopes import StorageKey, idempotency_prefix
from ..store import AppendOutcome, DeleteOutcome, Erased, HistoryPage, Idempotency, plan_stats
from ._conflicts import conversation_conflict
from ._locks import KeyLocks, polled, stripe_of

__all__ = ["AsyncInMemoryStore", "InMemoryStore"]


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
        self._expires: dict[StorageKey, float] = {}  # retention: when a key expires

    # -- retention (decided by flowmem.retention; call under the mutex) ---------
    def _expire(self, key: StorageKey, now: float | None) -> None:
        """Drop ``key``, with its idempotency records, if it expired by ``now``."""
        if now is not None and expired(self._expires.get(key), now):
            self._drop(key)

    def _hidden(self, key: StorageKey, now: float | None) -> bool:
        """Whether a read at ``now`` sees ``key`` as absent (expired, not yet swept)."""
        return now is not None and expired(self._expires.get(key), now)

    def _drop(self, key: StorageKey, *, records: bool = True) -> bool:
        """Remove ``key``; an expired one takes its idempotency ``records`` with it (a
        delete keeps them: a retry of a request made before it still replays)."""
        self._last_buffer = _NO_BUFFER
        self._expires.pop(key, None)
        if records:
            prefix = idempotency_prefix(key)
            for name in [name for name in self._keys if name.startswith(prefix)]:
                del self._keys[name]
        return self._data.pop(key, None) is not None

    def _expiring(self, key: StorageKey, expiry: Expiry | None) -> None:
        if expiry is not None:
            self._expire(key, expiry.now)
            if expiry.renew or key not in self._expires:
                self._expires[key] = expiry.at

    def touch(self, key: StorageKey, expiry: Expiry) -> bool:
        """Move the expiry of a live key (``refresh_on_read``); whether it was there."""
        with self._mutex:
            self._expire(key, expiry.now)
            if key not in self._data:
                return False
            self._expires[key] = expiry.at
            return True

    def sweep(self, now: float, *, batch: int = 500) -> Swept:
        """Delete up to ``batch`` keys expired by ``now``; counts by scope."""
        with self._mutex:
            due = [key for key, at in self._expires.items() if expired(at, now)]
            counts: dict[str, int] = {}
            for key in due[:batch]:
                if self._drop(key):
                    counts[key.scope] = counts.get(key.scope, 0) + 1
            return Swept(counts, done=len(due) <= batch)

    def read(self, key: StorageKey, *, now: float | None = None) -> tuple[bool, Any]:
        with self._mutex:
            held = None if self._hidden(key, now) else self._data.get(key)
            if held is None:
                return False, None
            if isinstance(held, ConversationBuffer):
                return True, held.messages
            return True, json_copy(held.value)

    def write(self, key: StorageKey, value: Any, *,
              idempotency: Idempotency | None = None, replace: bool = False,
              expiry: Expiry | None = None) -> bool:
        copied = json_copy(value)
        with self._mutex:
            self._expiring(key, expiry)
            if self._replay(idempotency) is not None:
                return True
            if not replace and isinstance(self._data.get(key), ConversationBuffer):
                raise conversation_conflict(key)
            self._last_buffer = _NO_BUFFER
            self._data[key] = _Value(copied)
            self._record(idempotency, True)
            return False

    def delete(self, key: StorageKey, *,
               idempotency: Idempotency | None = None) -> DeleteOutcome:
        with self._mutex:
            first = self._replay(idempotency)
            if first is not None:
                return DeleteOutcome(bool(first), replayed=True)
            found = self._drop(key, records=False)
            self._record(idempotency, found)
            return DeleteOutcome(found)

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
               idempotency: Idempotency | None = None, tail: int = 0,
               expiry: Expiry | None = None) -> AppendOutcome:
        # the MEM-12 lock without a lock file is one thread lock: taken directly
        hot = self._hot
        if hot[0] is key:  # the same (frozen) key as the last append: the same lock
            lock = hot[1]
        else:
            lock = self._locks.thread_lock(stripe_of(key))
            self._hot = (key, lock)
        if not lock.acquire(True, lock_timeout if lock_timeout > 0.0 else 0.0):
            return self._apply(key, incoming, max_messages, False, idempotency, tail, expiry)
        try:
            return self._apply(key, incoming, max_messages, True, idempotency, tail, expiry)
        finally:
            lock.release()

    def apply_append(self, key: StorageKey, incoming: Sequence[Message], *,
                     max_messages: int | None, serialized: bool = True,
                     idempotency: Idempotency | None = None, tail: int = 0,
                     expiry: Expiry | None = None) -> AppendOutcome:
        """The append's atomic step, for a caller that already waited for the MEM-12 lock."""
        return self._apply(key, incoming, max_messages, serialized, idempotency, tail, expiry)

    def _apply(self, key: StorageKey, incoming: Sequence[Message], max_messages: int | None,
               serialized: bool, idempotency: Idempotency | None,
               tail: int = 0, expiry: Expiry | None = None) -> AppendOutcome:
        with self._mutex:
            if expiry is not None:
                self._expiring(key, expiry)
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
                before: int | None = None, now: float | None = None) -> HistoryPage:
        with self._mutex:
            if self._hidden(key, now):
                return HistoryPage(total=0)
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
             after: str | None = None, limit: int = 100, now: float | None = None) -> list[str]:
        with self._mutex:
            found = sorted(k.key for k in self._data
                           if k.scope == scope and k.scope_id == scope_id
                           and not self._hidden(k, now)
                           and k.key.startswith(prefix) and (after is None or k.key > after))
        return found[:limit]

    def erase(self, scope: str, scope_id: str, *, dry_run: bool = False) -> Erased:
        """One atomic step under the store's mutex: no append can race it."""
        with self._mutex:
            keys = [k for k in self._data if k.scope == scope and k.scope_id == scope_id]
            prefixes = tuple(idempotency_prefix(k) for k in keys)
            records = [i for i in self._keys if i.startswith(prefixes)] if prefixes else []
            buffers = [b for b in (self._data[k] for k in keys)
                       if isinstance(b, ConversationBuffer)]
            erased = Erased(len(buffers), len(keys) - len(buffers),
                            sum(len(b) for b in buffers), len(records))
            if not dry_run:
                self._last_buffer = _NO_BUFFER
                for key in keys:
                    del self._data[key]
                    self._expires.pop(key, None)
                for record in records:
                    del self._keys[record]
            return erased

    def lock(self, key: StorageKey, timeout: float) -> AbstractContextManager[bool]:
        return self._locks.hold(key, timeout)

    def close(self) -> None:
        with self._mutex:
            self._last_buffer = _NO_BUFFER
            self._data.clear()
            self._expires.clear()


class AsyncInMemoryStore:
    """``memory://`` for asyncio: the blocking in-process store, called on the loop."""

    def __init__(self, store: InMemoryStore | None = None) -> None:
        self._store = store or InMemoryStore()

    async def read(self, key: StorageKey, *, now: float | None = None) -> tuple[bool, Any]:
        return self._store.read(key, now=now)

    async def write(self, key: StorageKey, value: Any, *,
                    idempotency: Idempotency | None = None, replace: bool = False,
                    expiry: Expiry | None = None) -> bool:
        return self._store.write(key, value, idempotency=idempotency, replace=replace,
                                 expiry=expiry)

    async def touch(self, key: StorageKey, expiry: Expiry) -> bool:
        return self._store.touch(key, expiry)

    async def sweep(self, now: float, *, batch: int = 500) -> Swept:
        return self._store.sweep(now, batch=batch)

    async def delete(self, key: StorageKey, *,
                     idempotency: Idempotency | None = None) -> DeleteOutcome:
        return self._store.delete(key, idempotency=idempotency)

    async def append(self, key: StorageKey, incoming: Sequence[Message], *,
                     max_messages: int | None, lock_timeout: float,
                     idempotency: Idempotency | None = None, tail: int = 0,
                     expiry: Expiry | None = None) -> AppendOutcome:
        async with self.lock(key, lock_timeout) as held:
            return self._store.apply_append(key, incoming, max_messages=max_messages,
                                            serialized=held, idempotency=idempotency, tail=tail,
                                            expiry=expiry)

    async def history(self, key: StorageKey, *, last: int | None = None,
                      before: int | None = None, now: float | None = None) -> HistoryPage:
        return self._store.history(key, last=last, before=before, now=now)

    async def edit(self, key: StorageKey, position: int, message: Message | None) -> bool:
        return self._store.edit(key, position, message)

    async def keys(self, scope: str, scope_id: str, *, prefix: str = "",
                   after: str | None = None, limit: int = 100,
                   now: float | None = None) -> list[str]:
        return self._store.keys(scope, scope_id, prefix=prefix, after=after, limit=limit,
                                now=now)

    async def erase(self, scope: str, scope_id: str, *, dry_run: bool = False) -> Erased:
        return self._store.erase(scope, scope_id, dry_run=dry_run)

    def lock(self, key: StorageKey, timeout: float) -> AbstractAsyncContextManager[bool]:
        return polled(lambda wait: self._store.lock(key, wait), timeout)

    async def aclose(self) -> None:
        self._store.close()
