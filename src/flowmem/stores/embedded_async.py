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
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager
from queue import Empty, SimpleQueue
from typing import Any, Final, TypeVar

from ..errors import StoreError
from ..messages import Message
from ..scopes import StorageKey
from ..store import AppendOutcome, HistoryPage, Idempotency, Store
from .memory import InMemoryStore
from .sqlite import SQLiteStore
from .sqlite_group import AppendRequest

__all__ = ["AsyncInMemoryStore", "AsyncSQLiteStore"]

_T = TypeVar("_T")
_POLL: Final = 0.001
MAX_GROUP: Final = 64
"""At most this many queued appends share one transaction."""


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
                     idempotency: Idempotency | None = None) -> AppendOutcome:
        async with self.lock(key, lock_timeout) as held:
            return self._store.apply_append(key, incoming, max_messages=max_messages,
                                            serialized=held, idempotency=idempotency)

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


class _Job:
    """One queued operation: a call, or an append that may join a group."""

    __slots__ = ("append", "function", "future")

    def __init__(self, function: Callable[[], Any] | None,
                 append: AppendRequest | None = None) -> None:
        self.function = function
        self.append = append
        self.future: Future[Any] = Future()


class AsyncSQLiteStore:
    """``sqlite://`` for asyncio: the blocking store on one connection thread of its own.

    The database is opened (and migrated) on that thread too, so constructing
    the store never blocks the loop; an error opening it (a missing
    directory, an unreadable file) is raised by the first call. Appends
    queued together share one transaction (group commit, see the module
    notes), at most ``max_group`` of them.
    """

    def __init__(self, opener: Callable[[], Store], *, max_group: int = MAX_GROUP) -> None:
        self._queue: SimpleQueue[_Job | None] = SimpleQueue()
        self._guard = threading.Lock()
        self._closed = False
        self._max_group = max(1, max_group)
        self._opened: Store | None = None
        self._open_error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, args=(opener,),
                                        name="flowmem-sqlite", daemon=True)
        self._thread.start()

    @classmethod
    def from_url(cls, url: str) -> AsyncSQLiteStore:
        """The same URLs and options as :class:`~flowmem.stores.sqlite.SQLiteStore`."""
        return cls(lambda: SQLiteStore.from_url(url))

    @property
    def _store(self) -> Store:
        # only ever called on the connection thread, after the opener ran
        if self._opened is None:
            assert self._open_error is not None
            raise self._open_error
        return self._opened

    # -- the connection thread -------------------------------------------------------
    def _serve(self, opener: Callable[[], Store]) -> None:
        try:
            self._opened = opener()
        except BaseException as exc:  # raised again by every call
            self._open_error = exc
        while True:
            job = self._queue.get()
            if job is None:
                return
            batch = [job]
            while len(batch) < self._max_group:  # what queued meanwhile joins
                try:
                    more = self._queue.get_nowait()
                except Empty:
                    break
                if more is None:
                    self._queue.put(None)  # serve the batch, then stop
                    break
                batch.append(more)
            self._run_batch(batch)

    def _run_batch(self, batch: list[_Job]) -> None:
        appends: list[_Job] = []
        for job in batch:
            if job.append is not None:
                appends.append(job)
                continue
            self._run_appends(appends)  # in queue order: earlier appends first
            appends = []
            if job.future.set_running_or_notify_cancel():  # a cancelled job never runs
                _settle(job.future, job.function)
        self._run_appends(appends)

    def _run_appends(self, jobs: list[_Job]) -> None:
        live = [job for job in jobs if job.future.set_running_or_notify_cancel()]
        if not live:
            return
        group = getattr(self._opened, "append_group", None)
        if len(live) == 1 or group is None:
            for job in live:
                _settle(job.future, job.function)
            return
        try:
            answers = group([job.append for job in live])
        except BaseException as exc:
            for job in live:
                job.future.set_exception(exc)
            return
        for job, answer in zip(live, answers, strict=True):
            if isinstance(answer, BaseException):
                job.future.set_exception(answer)
            else:
                job.future.set_result(answer)

    def _close_store(self) -> None:
        if self._opened is not None:
            self._opened.close()

    # -- the loop's side ----------------------------------------------------------------
    def _submit(self, job: _Job) -> Future[Any]:
        with self._guard:
            if self._closed:
                raise StoreError("the store is closed")
            self._queue.put(job)
        return job.future

    async def _call(self, function: Callable[[], _T]) -> _T:
        result: _T = await asyncio.wrap_future(self._submit(_Job(function)))
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
                     idempotency: Idempotency | None = None) -> AppendOutcome:
        request = AppendRequest(key, incoming, max_messages, lock_timeout, idempotency)
        job = _Job(lambda: self._store.append(
            key, incoming, max_messages=max_messages, lock_timeout=lock_timeout,
            idempotency=idempotency), request)
        outcome: AppendOutcome = await asyncio.wrap_future(self._submit(job))
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
        # Taken and released on the connection thread, which owns the thread lock;
        # the thread stays free for other operations meanwhile.
        context = await self._call(lambda: self._store.lock(key, timeout))
        held = await self._call(context.__enter__)
        try:
            yield held
        finally:
            await asyncio.shield(self._call(lambda: context.__exit__(None, None, None)))

    async def aclose(self) -> None:
        closing = _Job(self._close_store)
        with self._guard:
            if self._closed:
                return
            self._closed = True
            self._queue.put(closing)
            self._queue.put(None)  # the thread stops after what was queued before
        await asyncio.wrap_future(closing.future)


def _settle(future: Future[Any], function: Callable[[], Any] | None) -> None:
    """Run ``function`` and give its answer to ``future`` (already marked running)."""
    assert function is not None
    try:
        answer = function()
    except BaseException as exc:
        future.set_exception(exc)
    else:
        future.set_result(answer)
