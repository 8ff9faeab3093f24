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

__all__ = ["RESERVED_SCOPE", "KeyLocks", "as_mapping", "reserved"]

RESERVED_SCOPE: Final = "_flowmem"


def reserved(scope_id: str, key: str) -> StorageKey:
    """A key of the service's own records (never reachable through ``Memory``)."""
    return StorageKey(RESERVED_SCOPE, scope_id, key)


def as_mapping(value: Any) -> dict[str, Any] | None:
    """A stored record if it is a JSON object, else ``None``."""
    return value if isinstance(value, dict) else None


class KeyLocks:
    """The service's read-modify-write lock on one of its records: in-process first, then
    the store's lock (across processes).

    Coroutines of this process queue on an :class:`asyncio.Lock` per key, so at most
    one of them at a time waits for the store's lock. That wait then only ever
    waits for another process, never for a coroutine of this one, whose next store
    call might have to pass through the same connection (a SQLite store's one
    connection thread) that the wait occupies.
    """

    def __init__(self) -> None:
        self._locks: dict[StorageKey, asyncio.Lock] = {}
        self._waiting: dict[StorageKey, int] = {}

    @asynccontextmanager
    async def hold(self, store: AsyncStore, key: StorageKey,
                   timeout: float) -> AsyncIterator[bool]:
        """Yield whether ``key`` is held within ``timeout`` seconds (in all)."""
        deadline = time.monotonic() + timeout
        lock = self._locks.setdefault(key, asyncio.Lock())
        self._waiting[key] = self._waiting.get(key, 0) + 1
        try:
            try:
                await asyncio.wait_for(lock.acquire(), timeout)
            except TimeoutError:
                acquired = False
            else:
                acquired = True
            if not acquired:
                yield False
                return
            try:
                async with store.lock(key, max(deadline - time.monotonic(), 0.0)) as held:
                    yield held
            finally:
                lock.release()
        finally:
            self._waiting[key] -= 1
            if not self._waiting[key]:
                del self._waiting[key], self._locks[key]
