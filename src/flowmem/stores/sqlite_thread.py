"""The connection thread of the asyncio SQLite store: a queue, batches, group commit.

One thread per :class:`~flowmem.stores.embedded_async.AsyncSQLiteStore` owns
the blocking :class:`~flowmem.stores.sqlite.SQLiteStore` (opened on it). It
takes the first queued job and whatever queued meanwhile (at most
``max_group``), and runs them in queue order: consecutive appends as ONE group
(:meth:`~flowmem.stores.sqlite.SQLiteStore.append_group`: one transaction, a
savepoint each), every other operation alone. Each job's future is answered
after the commit that holds it. A job is claimed with
:meth:`concurrent.futures.Future.set_running_or_notify_cancel`, so one
cancelled while queued never runs, and one running is never interrupted.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from queue import Empty, SimpleQueue
from threading import Thread
from typing import Any, Final

from ..store import Store
from .sqlite_group import AppendRequest

__all__ = ["MAX_GROUP", "ConnectionThread", "Job"]

MAX_GROUP: Final = 64
"""At most this many queued appends share one transaction."""


class Job:
    """One queued operation: a call, or an append that may join a group."""

    __slots__ = ("append", "function", "future")

    def __init__(self, function: Callable[[], Any],
                 append: AppendRequest | None = None) -> None:
        self.function = function
        self.append = append
        self.future: Future[Any] = Future()


class ConnectionThread:
    """The thread, its queue (``None`` stops it) and the store it opened."""

    def __init__(self, opener: Callable[[], Store], max_group: int = MAX_GROUP) -> None:
        self.queue: SimpleQueue[Job | None] = SimpleQueue()
        self.max_group = max(1, max_group)
        self._opened: Store | None = None
        self._open_error: BaseException | None = None
        Thread(target=self._serve, args=(opener,), name="flowmem-sqlite", daemon=True).start()

    @property
    def store(self) -> Store:
        """The opened store, or the error opening it raised (on the thread only)."""
        if self._opened is None:
            assert self._open_error is not None
            raise self._open_error
        return self._opened

    def close_store(self) -> None:
        if self._opened is not None:
            self._opened.close()

    def _serve(self, opener: Callable[[], Store]) -> None:
        try:
            self._opened = opener()
        except BaseException as exc:  # raised again by every call
            self._open_error = exc
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            self._run_batch(batch)
            del batch  # a finished job must not keep its store alive while the thread waits

    def _next_batch(self) -> list[Job] | None:
        """The first queued job and what queued meanwhile; ``None``: stop."""
        job = self.queue.get()
        if job is None:
            return None
        batch = [job]
        while len(batch) < self.max_group:  # what queued meanwhile joins
            try:
                more = self.queue.get_nowait()
            except Empty:
                break
            if more is None:
                self.queue.put(None)  # serve the batch, then stop
                break
            batch.append(more)
        return batch

    def _run_batch(self, batch: list[Job]) -> None:
        appends: list[Job] = []
        for job in batch:
            if job.append is not None:
                appends.append(job)
                continue
            self._run_appends(appends)  # in queue order: earlier appends first
            appends = []
            if job.future.set_running_or_notify_cancel():  # a cancelled job never runs
                _settle(job)
        self._run_appends(appends)

    def _run_appends(self, jobs: list[Job]) -> None:
        live = [job for job in jobs if job.future.set_running_or_notify_cancel()]
        group = getattr(self._opened, "append_group", None)
        if len(live) <= 1 or group is None:
            for job in live:
                _settle(job)
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


def _settle(job: Job) -> None:
    """Run the job's call and give its answer to its future (already marked running)."""
    try:
        answer = job.function()
    except BaseException as exc:
        job.future.set_exception(exc)
    else:
        job.future.set_result(answer)
