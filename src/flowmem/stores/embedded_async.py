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
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager
from functools import partial
from typing import Any, Final, TypeVar

from ..errors import StoreError
from ..messages import Message
from ..scopes import StorageKey
from ..store import AppendOutcome, HistoryPage, Idempotency, Store
from .memory import InMemoryStore
from .sqlite import SQLiteStore
from .sqlite_group import AppendRequest
from .sqlite_thread import MAX_GROUP, ConnectionThread, Job

__all__ = ["AsyncInMemoryStore", "AsyncSQLiteStore"]

_T = TypeVar("_T")
_POLL: Final = 0.001


class AsyncInMemoryStore:
    """``memory://`` for asyncio: the blocking in-process store, called on the loop."""

    def __init__(self, store: InMemoryStore | None = None) -> None:
        self._store = store or InMemoryStore()

    async def read(self, key: StorageKey) -> tuple[bool, Any]:
        return self._store.read(key)

    async def write(self, key: StorageKey, value: Any, *,
                    idempotency: Idempotency | None = None) -> None:
        self._store.write(key, value, idempotency=idempotency)

    async def delete(self, key: StorageKey, *, idempotency: Idempotency | None = None) -> bool:
        return self._store.delete(key, idempotency=idempotency)

    async def append(self, key: StorageKey, incoming: Sequence[Message], *,
                     max_messages: int | None, lock_timeout: float,
                     idempotency: Idempotency | None = None, tail: int = 0) -> AppendOutcome:
        async with self.lock(key, lock_timeout) as held:
            return self._store.apply_append(key, incoming, max_messages=max_messages,
                                            serialized=held, idempotency=idempotency, tail=tail)

    async def history(self, key: StorageKey, *, last: int | None = None,
                      before: int | None = None) -> HistoryPage:
        return self._store.history(key, last=last, before=before)

    async def edit(self, key: StorageKey, position: int, message: Message | None) -> bool:
        return self._store.edit(key, position, message)

    async def keys(self, scope: str, scope_id: str, *, prefix: str = "",
                   after: str | None = None, limit: int = 100) -> list[str]:
        return self._store.keys(scope, scope_id, prefix=prefix, after=after, limit=limit)

    def lock(self, key: StorageKey, timeout: float) -> AbstractAsyncContextManager[bool]:
        return _polled(lambda wait: self._store.lock(key, wait), timeout)

    async def aclose(self) -> None:
        self._store.close()


@asynccontextmanager
async def _polled(hold: Callable[[float], AbstractContextManager[bool]],
                  timeout: float) -> AsyncIterator[bool]:
    """Take a blocking lock without blocking the loop: try, sleep, try again, until ``timeout``."""
    deadline = time.monotonic() + max(timeout, 0.0)
    while True:
        held = hold(0.0)
        if held.__enter__():
            break
        held.__exit__(None, None, None)
        if time.monotonic() >= deadline:
            yield False
            return
        await asyncio.sleep(_POLL)
    try:
        yield True
    finally:
        held.__exit__(None, None, None)


class AsyncSQLiteStore:
    """``sqlite://`` for asyncio: the blocking store on one connection thread of its own.

    The database is opened (and migrated) on that thread too, so constructing
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
        return cls(lambda: SQLiteStore.from_url(url, queue_writers=True))

    @property
    def _store(self) -> Store:
        return self._connection.store  # only ever called on the connection thread

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

    async def read(self, key: StorageKey) -> tuple[bool, Any]:
        return await self._call(lambda: self._store.read(key))

    async def write(self, key: StorageKey, value: Any, *,
                    idempotency: Idempotency | None = None) -> None:
        await self._call(lambda: self._store.write(key, value, idempotency=idempotency))

    async def delete(self, key: StorageKey, *, idempotency: Idempotency | None = None) -> bool:
        return await self._call(lambda: self._store.delete(key, idempotency=idempotency))

    async def append(self, key: StorageKey, incoming: Sequence[Message], *,
                     max_messages: int | None, lock_timeout: float,
                     idempotency: Idempotency | None = None, tail: int = 0) -> AppendOutcome:
        request = AppendRequest(key, incoming, max_messages, lock_timeout, idempotency, tail)
        job = Job(lambda: self._store.append(
            key, incoming, max_messages=max_messages, lock_timeout=lock_timeout,
            idempotency=idempotency, tail=tail), request)
        outcome: AppendOutcome = await self._submit(job)
        return outcome

    async def history(self, key: StorageKey, *, last: int | None = None,
                      before: int | None = None) -> HistoryPage:
        return await self._call(lambda: self._store.history(key, last=last, before=before))

    async def edit(self, key: StorageKey, position: int, message: Message | None) -> bool:
        return await self._call(lambda: self._store.edit(key, position, message))

    async def keys(self, scope: str, scope_id: str, *, prefix: str = "",
                   after: str | None = None, limit: int = 100) -> list[str]:
        return await self._call(lambda: self._store.keys(scope, scope_id, prefix=prefix,
                                                         after=after, limit=limit))

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

