"""The connection thread of the asyncio SQLite store: a queue, batches, group commit.

One thread per :class:`~flowmem.stores.sqlite._aio.AsyncSQLiteStore` owns
the blocking :class:`~flowmem.stores.sqlite.SQLiteStore` (opened on it). It
takes the first queued job and whatever queued meanwhile (at most
``max_group``), and runs them in queue order: consecutive appends as ONE group
(:meth:`~flowmem.stores.sqlite.SQLiteStore.append_group`: one transaction, a
savepoint each), every other operation alone. Each job's future is answered
after the commit that holds it: a batch's answers go back to the loop in ONE
call (:meth:`asyncio.loop.call_soon_threadsafe`), not a wake-up of the loop
per job. A job whose future was cancelled while it queued never runs; one
running is never interrupted (a cancellation then only drops its answer), so
an operation is whole or absent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from queue import Empty, SimpleQueue
from threading import Thread
from typing import Any, Final

from ...store import Store
from ._group_commit import AppendRequest

__all__ = ["MAX_GROUP", "ConnectionThread", "Job"]

MAX_GROUP: Final = 64
"""At most this many queued appends share one transaction."""


class Job:
    """One queued operation: a call, or an append that may join a group; made on the
    loop that awaits :attr:`future`."""

    __slots__ = ("answer", "append", "failed", "function", "future", "loop")

    def __init__(self, function: Callable[[], Any],
                 append: AppendRequest | None = None) -> None:
        self.function = function
        self.append = append
        self.loop = asyncio.get_running_loop()
        self.future: asyncio.Future[Any] = self.loop.create_future()
        self.answer: Any = None
        self.failed = False

    def claimed(self) -> bool:
        """Whether the job should run (on the connection thread): not if its future was
        cancelled while it queued. Reading the state from this thread is one attribute
        read; a cancellation right after it only drops the answer of a whole run."""
        return not self.future.cancelled()

    def settle(self, answer: Any, failed: bool = False) -> None:
        self.answer, self.failed = answer, failed


def _deliver(jobs: list[Job]) -> None:
    """On the loop: give each job's answer to its future (unless cancelled meanwhile)."""
    for job in jobs:
        future = job.future
        if future.done():
            continue
        if job.failed:
            future.set_exception(job.answer)
        else:
            future.set_result(job.answer)
        job.answer = None


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
        ran: list[Job] = []
        for job in batch:
            if job.append is not None:
                appends.append(job)
                continue
            ran += self._run_appends(appends)  # in queue order: earlier appends first
            appends = []
            if job.claimed():  # a cancelled job never runs
                _run(job)
                ran.append(job)
        ran += self._run_appends(appends)
        _answer(ran)

    def _run_appends(self, jobs: list[Job]) -> list[Job]:
        live = [job for job in jobs if job.claimed()]
        group = getattr(self._opened, "append_group", None)
        if len(live) <= 1 or group is None:
            for job in live:
                _run(job)
            return live
        try:
            answers = group([job.append for job in live])
        except BaseException as exc:
            for job in live:
                job.settle(exc, failed=True)
            return live
        for job, answer in zip(live, answers, strict=True):
            job.settle(answer, failed=isinstance(answer, BaseException))
        return live


def _run(job: Job) -> None:
    """Run the job's call and keep its answer (or its error) for :func:`_answer`."""
    try:
        job.settle(job.function())
    except BaseException as exc:
        job.settle(exc, failed=True)


def _answer(jobs: list[Job]) -> None:
    """Hand the answers of a batch to their loops: one call per loop, not one per job."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Job]] = {}
    for job in jobs:
        by_loop.setdefault(job.loop, []).append(job)
    for loop, answered in by_loop.items():
        # a closed loop raises RuntimeError: nobody awaits these answers any more
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_deliver, answered)
