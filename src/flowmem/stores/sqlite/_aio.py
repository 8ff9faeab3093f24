"""The embedded stores for :class:`~flowmem.AsyncMemory`: ``memory://`` and ``sqlite://``.

``memory://`` does no I/O: its operations run on the loop directly (each is a
short critical section of the blocking store). Its MEM-12 lock is waited for
with ``asyncio.sleep`` polling, never by blocking the loop.

``sqlite://`` keeps ONE connection thread per store, fed by a queue: every
operation of the blocking :class:`~flowmem.stores.sqlite.SQLiteStore` runs
there, so the loop never waits on a file lock, an fsync or SQLite's busy
handler. MEM-12 is the blocking store's own (thread and ``fcntl`` locks on
the same lock file), so async and blocking writers of any process serialize
with each other.

Group commit: the appends queued one after another when the thread comes
for work run in ONE transaction with one fsync
(:meth:`~flowmem.stores.sqlite.SQLiteStore.append_group`: each in its own
savepoint, so one refused append does not fail its neighbours; the locks of
all their keys held across it). Each is answered only after the commit that
holds it. Other operations run alone, in the order they were queued.

Cancelling a call never interrupts the statement: an operation already
handed to the thread finishes (committed whole, its lock released), one
still queued never starts.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import Any, Final, TypeVar, cast

from ...errors import StoreError
from ...messages import Message
from ...retention import Expiry, Swept
from ...scopes import StorageKey
from ...store import AppendOutcome, DeleteOutcome, Erased, HistoryPage, Idempotency, Store
from ._group_commit import AppendRequest
from ._store import SQLiteStore
from ._thread import MAX_GROUP, ConnectionThread, Job

__all__ = ["AsyncSQLiteStore"]

_T = TypeVar("_T")
_POLL: Final = 0.001


class AsyncSQLiteStore:
    """``sqlite://`` for asyncio: the blocking store on one connection thread of its own.

    The database is opened (its schema created or checked) on that thread too, so constructing
    the store never blocks the loop; an error opening it (a missing
    directory, an unreadable file) is raised by the first call. Appends
    queued together share one transaction (group commit, see the module
    notes), at most ``max_group`` of them.
    """

    def __init__(self, opener: Callable[[], Store], *, max_group: int = MAX_GROUP) -> None:
        self._guard = threading.Lock()
        self._closed = False
        self._connection = ConnectionThread(opener, max_group)
        # a store dropped without aclose() still lets its thread go
        weakref.finalize(self, self._connection.queue.put, None)

    @classmethod
    def from_url(cls, url: str) -> AsyncSQLiteStore:
        """The same URLs and options as :class:`~flowmem.stores.sqlite.SQLiteStore`."""
        return cls(lambda: SQLiteStore.from_url(url))

    @property
    def _store(self) -> Store:
        return self._connection.store  # only ever called on the connection thread

    @property
    def _sqlite(self) -> SQLiteStore:
        """The connection thread's store with its retention keywords (on that thread)."""
        return cast(SQLiteStore, self._connection.store)

    # -- the loop's side ----------------------------------------------------------------
    def _submit(self, job: Job) -> asyncio.Future[Any]:
        with self._guard:
            if self._closed:
                raise StoreError("the store is closed")
            self._connection.queue.put(job)
        return job.future

    async def _call(self, function: Callable[[], _T]) -> _T:
        result: _T = await self._submit(Job(function))
        return result

    async def read(self, key: StorageKey, *, now: float | None = None) -> tuple[bool, Any]:
        if now is not None:
            return await self._call(lambda: self._sqlite.read(key, now=now))
        return await self._call(lambda: self._store.read(key))

    async def write(self, key: StorageKey, value: Any, *,
                    idempotency: Idempotency | None = None,
                    replace: bool = False, expiry: Expiry | None = None) -> bool | None:
        if expiry is not None:
            return await self._call(lambda: self._sqlite.write(
                key, value, idempotency=idempotency, replace=replace, expiry=expiry))
        return await self._call(lambda: self._store.write(key, value, idempotency=idempotency,
                                                          replace=replace))

    async def touch(self, key: StorageKey, expiry: Expiry) -> bool:
        return await self._call(lambda: self._sqlite.touch(key, expiry))

    async def sweep(self, now: float, *, batch: int = 500) -> Swept:
        return await self._call(lambda: self._sqlite.sweep(now, batch=batch))

    async def delete(self, key: StorageKey, *,
                     idempotency: Idempotency | None = None) -> DeleteOutcome:
        return await self._call(lambda: self._store.delete(key, idempotency=idempotency))

    async def append(self, key: StorageKey, incoming: Sequence[Message], *,
                     max_messages: int | None, lock_timeout: float,
                     idempotency: Idempotency | None = None, tail: int = 0,
                     expiry: Expiry | None = None) -> AppendOutcome:
        if expiry is not None:  # alone, not in a group: its purge and expiry ride with it
            expiring: AppendOutcome = await self._call(lambda: self._sqlite.append(
                key, incoming, max_messages=max_messages, lock_timeout=lock_timeout,
                idempotency=idempotency, tail=tail, expiry=expiry))
            return expiring
        request = AppendRequest(key, incoming, max_messages, lock_timeout, idempotency, tail)
        job = Job(lambda: self._store.append(
            key, incoming, max_messages=max_messages, lock_timeout=lock_timeout,
            idempotency=idempotency, tail=tail), request)
        outcome: AppendOutcome = await self._submit(job)
        return outcome

    async def history(self, key: StorageKey, *, last: int | None = None,
                      before: int | None = None, now: float | None = None) -> HistoryPage:
        if now is not None:
            return await self._call(lambda: self._sqlite.history(key, last=last, before=before,
                                                                 now=now))
        return await self._call(lambda: self._store.history(key, last=last, before=before))

    async def edit(self, key: StorageKey, position: int, message: Message | None) -> bool:
        return await self._call(lambda: self._store.edit(key, position, message))

    async def keys(self, scope: str, scope_id: str, *, prefix: str = "",
                   after: str | None = None, limit: int = 100,
                   now: float | None = None) -> list[str]:
        return await self._call(lambda: self._sqlite.keys(scope, scope_id, prefix=prefix,
                                                          after=after, limit=limit, now=now))

    async def erase(self, scope: str, scope_id: str, *, dry_run: bool = False) -> Erased:
        """As the blocking store's, each transaction a job of its own (appends queued
        meanwhile are not held up for the whole erasure)."""
        def steps() -> SQLiteStore:  # called on the connection thread only
            return cast(SQLiteStore, self._store)

        def fence(up: bool) -> None:
            steps().erase_fence(scope, scope_id, up=up, dry_run=dry_run)

        def listing(after: str) -> list[str]:
            return steps().erase_page(scope, scope_id, after)

        def one(name: str) -> Erased:
            return steps().erase_key(StorageKey(scope, scope_id, name), dry_run)

        await self._call(partial(fence, True))
        total, after = Erased(), ""
        while page := await self._call(partial(listing, after)):
            for name in page:
                total += await self._call(partial(one, name))
            after = page[-1]
        await self._call(partial(fence, False))
        return total

    def lock(self, key: StorageKey, timeout: float) -> AbstractAsyncContextManager[bool]:
        return self._held(key, timeout)

    @asynccontextmanager
    async def _held(self, key: StorageKey, timeout: float) -> AsyncIterator[bool]:
        # Tried without waiting on the connection thread, and waited for on the loop:
        # a wait there would stall every other operation of this store, the holder's
        # own included (a holder's next call would queue behind its waiter).
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            context = await self._call(lambda: self._store.lock(key, 0.0))
            if await self._call(context.__enter__):
                break
            await self._call(partial(context.__exit__, None, None, None))
            if time.monotonic() >= deadline:
                yield False
                return
            await asyncio.sleep(_POLL)
        try:
            yield True
        finally:
            await asyncio.shield(self._call(partial(context.__exit__, None, None, None)))

    async def aclose(self) -> None:
        closing = Job(self._connection.close_store)
        with self._guard:
            if self._closed:
                return
            self._closed = True
            self._connection.queue.put(closing)
            self._connection.queue.put(None)  # the thread stops after what was queued before
        await closing.future

