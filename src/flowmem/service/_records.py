"""One read-modify-write of a service record, never holding a connection while it
waits for another.

A store that offers ``modify`` (PostgreSQL) reads, changes and writes the record
in one transaction on one pooled connection, its row locked: nothing else of
the same pool is awaited while it is held, so the service runs behind a
transaction pooler with a server pool of one per process (slower, never
stuck). The other stores keep the store lock + read + write of
:class:`~._registry.KeyLocks` (their lock holds no pooled connection: SQLite's
one connection thread is spared by the in-process queue, Redis's lock is a
key). Either way coroutines of one process queue per record in the process
first, so at most one of them at a time waits in the store.
"""

from __future__ import annotations

from typing import Any, Final

from ..errors import StoreBusy
from ..scopes import StorageKey
from ..store import AsyncStore
from ..stores._modify import DELETE, KEEP, Change
from ._registry import KeyLocks

__all__ = ["DELETE", "KEEP", "modify"]

_BUSY: Final = "{key} stayed locked past {timeout}s"


async def modify(store: AsyncStore, locks: KeyLocks, key: StorageKey, change: Change,
                 timeout: float) -> tuple[bool, Any]:
    """Apply ``change`` (:mod:`flowmem.stores._modify`) to the record at ``key``
    atomically; ``(found, value)`` afterwards. :class:`StoreBusy` past ``timeout``."""
    atomic = getattr(store, "modify", None)
    if atomic is not None:
        async with locks.local(key, timeout) as queued:
            if not queued:
                raise StoreBusy(_BUSY.format(key=key.key, timeout=timeout))
            found, value = await atomic(key, change, timeout)
            return bool(found), value
    async with locks.hold(store, key, timeout) as held:
        if not held:
            raise StoreBusy(_BUSY.format(key=key.key, timeout=timeout))
        found, current = await store.read(key)
        wanted = change(found, current)
        if wanted is KEEP:
            return found, current
        if wanted is DELETE:
            await store.delete(key)
            return False, None
        await store.write(key, wanted)
        return True, wanted
