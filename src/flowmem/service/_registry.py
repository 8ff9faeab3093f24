"""Where the service keeps its own records: a reserved scope of the store.

Tokens and sessions live in the store's key-value API under the scope
:data:`RESERVED_SCOPE` (``"_flowmem"``). :class:`~flowmem.Memory` only ever
resolves the six GR-MEM scope names (anything else is an
:class:`~flowmem.UnknownScope`), so no memory endpoint can reach them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

from ..scopes import StorageKey
from ..store import AsyncStore

__all__ = ["RESERVED_SCOPE", "KeyLocks", "as_mapping", "lock_key", "reserved"]

RESERVED_SCOPE: Final = "_flowmem"
HELD_AT_ONCE: Final = 3


def reserved(scope_id: str, key: str) -> StorageKey:
    """A key of the service's own records (never reachable through ``Memory``)."""
    return StorageKey(RESERVED_SCOPE, scope_id, key)


def as_mapping(value: Any) -> dict[str, Any] | None:
    """A stored record if it is a JSON object, else ``None``."""
    return value if isinstance(value, dict) else None


def lock_key(key: StorageKey) -> StorageKey:
    """The key whose store lock guards updates of the record at ``key`` (see KeyLocks)."""
    return StorageKey(key.scope, f"lock/{key.scope_id}", key.key)


class KeyLocks:
    """The service's read-modify-write lock on one of its records: in-process first, then
    the store's lock (across processes).

    Coroutines of this process queue on an :class:`asyncio.Lock` per key, so at most
    one of them at a time waits for the store's lock. That wait then only ever
    waits for another process, never for a coroutine of this one, whose next store
    call might have to pass through the same connection (a SQLite store's one
    connection thread) that the wait occupies.

    The store's lock is taken on a sidecar key (:func:`lock_key`), never on the
    record's own: a store's write or delete of a key takes that key's MEM-12
    lock itself, in a transaction of its own (PostgreSQL's advisory lock), so
    holding the record's own lock across its write would wait on itself.

    At most :data:`HELD_AT_ONCE` store locks are held at once per instance. A
    store whose lock is a transaction (PostgreSQL) is never locked this way: its
    records are changed by one transaction each (:mod:`._records`), since a
    holder's reads and writes would need connections of their own from the pool
    (or the pooler's server pool) the lock already holds one of.
    """

    def __init__(self) -> None:
        self._locks: dict[StorageKey, asyncio.Lock] = {}
        self._waiting: dict[StorageKey, int] = {}
        self._holders = asyncio.Semaphore(HELD_AT_ONCE)

    @asynccontextmanager
    async def local(self, key: StorageKey, timeout: float) -> AsyncIterator[bool]:
        """Yield whether this process's queue for ``key`` was passed within ``timeout``
        seconds (the in-process half of :meth:`hold`, alone)."""
        deadline = time.monotonic() + timeout
        lock = self._locks.setdefault(key, asyncio.Lock())
        self._waiting[key] = self._waiting.get(key, 0) + 1
        try:
            if not await _acquire(lock, deadline):
                yield False
                return
            try:
                yield True
            finally:
                lock.release()
        finally:
            self._waiting[key] -= 1
            if not self._waiting[key]:
                del self._waiting[key], self._locks[key]

    @asynccontextmanager
    async def hold(self, store: AsyncStore, key: StorageKey,
                   timeout: float) -> AsyncIterator[bool]:
        """Yield whether ``key`` is held within ``timeout`` seconds (in all)."""
        deadline = time.monotonic() + timeout
        async with self.local(key, timeout) as queued:
            if not queued:
                yield False
                return
            if not await _acquire(self._holders, deadline):
                yield False
                return
            try:
                async with store.lock(lock_key(key),
                                      max(deadline - time.monotonic(), 0.0)) as held:
                    yield held
            finally:
                self._holders.release()


async def _acquire(lock: asyncio.Lock | asyncio.Semaphore, deadline: float) -> bool:
    """Whether ``lock`` was acquired before ``deadline`` (``time.monotonic``)."""
    try:
        await asyncio.wait_for(lock.acquire(), max(deadline - time.monotonic(), 0.0))
    except TimeoutError:
        return False
    return True
