"""Write turns on one SQLite file: threads queue on a mutex, processes on a lock byte.

SQLite lets one connection write at a time. Within a process, writers queue
on one mutex per database file (:func:`writer_turns`), so they never meet
SQLite's busy handler. Across processes they would: a connection that finds
the write lock taken sleeps in SQLite's busy handler — 1, 2, 5, 10 … up to
100 ms at a time — and can lose the race again each time it wakes, so a busy
writer process could starve another for hundreds of milliseconds
(``flowmem serve --workers 2``: p99 400 ms seen).

With ``queued=True`` (the asyncio store's connection thread, whose every
transaction is a group of appends) a write turn is also a byte of the lock
file (:mod:`.locks`, the byte after the setup lock): taken at once when
free; else the writer marks itself waiting (a shared lock on the next byte)
and tries again every 0.1 ms, doubling to 1 ms. A writer that is about to
take the byte and sees another process waiting lets it go first (for at most
5 ms), so two busy processes take turns. Every wait ends at the store's
``busy_timeout`` (a :class:`~flowmem.errors.StoreBusy` for the caller), and
the kernel drops a dead process's bytes. The byte is an optimisation only:
SQLite's own write lock is what makes a transaction atomic, and writers
that do not queue (the blocking store's) still meet it there.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Final

from .locks import SETUP

try:  # POSIX only; elsewhere writers queue within their process only
    import fcntl
except ImportError:  # pragma: no cover - not on Linux
    fcntl = None  # type: ignore[assignment]

__all__ = ["WAITING", "WRITER", "WriterTurns", "writer_turns"]

WRITER: Final = SETUP + 1
"""The lock file's byte held by the process whose queued writer has the write turn."""
WAITING: Final = SETUP + 2
"""The byte a queued writer of another process holds (shared) while it waits."""
_POLL_START: Final = 0.0001
_POLL_MAX: Final = 0.001
_YIELD_MAX: Final = 0.005


class WriterTurns:
    """The write turns of one database file in this process (see the module notes)."""

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        """The turns within the process: a writer that does not queue with other processes
        takes and releases it alone (what :meth:`take` and :meth:`give_back` do without a
        lock file)."""
        self._byte_held = False  # only read and written under the mutex

    def take(self, timeout: float, fd: int | None = None) -> bool:
        """Wait (at most ``timeout`` seconds) for the turn; with a lock file's ``fd``,
        queue with the other processes too. Whether the turn was had."""
        start: float | None = None
        if not self.mutex.acquire(False):
            start = time.monotonic()
            if not self.mutex.acquire(timeout=timeout):
                return False
        if fd is None or fcntl is None:
            return True
        try:
            waiting = _others_waiting(fd)  # then they go first, however free the byte is
            if (not waiting and _try(fd, WRITER)) or _queue(
                    fd, (start or time.monotonic()) + timeout, waiting):
                self._byte_held = True
                return True
        except BaseException:
            self.mutex.release()
            raise
        self.mutex.release()
        return False

    def give_back(self, fd: int | None = None) -> None:
        """End the turn :meth:`take` gave."""
        if self._byte_held:
            self._byte_held = False
            if fd is not None:
                fcntl.lockf(fd, fcntl.LOCK_UN, 1, WRITER, os.SEEK_SET)
        self.mutex.release()


def _try(fd: int, byte: int, kind: int = 0) -> bool:
    """Take ``byte`` without waiting (exclusive, or ``kind``); whether it was had."""
    try:
        fcntl.lockf(fd, (kind or fcntl.LOCK_EX) | fcntl.LOCK_NB, 1, byte, os.SEEK_SET)
    except OSError:
        return False
    return True


def _others_waiting(fd: int) -> bool:
    if not _try(fd, WAITING):
        return True
    fcntl.lockf(fd, fcntl.LOCK_UN, 1, WAITING, os.SEEK_SET)
    return False


def _queue(fd: int, deadline: float, others_first: bool) -> bool:
    """Wait for the byte, marked as waiting, until ``deadline``; ``others_first``: another
    process waits already, so let it in (at most :data:`_YIELD_MAX`) before queueing."""
    if others_first:
        until = min(deadline, time.monotonic() + _YIELD_MAX)
        while _others_waiting(fd) and time.monotonic() < until:
            time.sleep(_POLL_START)
    marked = _try(fd, WAITING, fcntl.LOCK_SH)  # fails only against a probe's instant
    delay = _POLL_START
    try:
        while not _try(fd, WRITER):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, _POLL_MAX)
            if not marked:
                marked = _try(fd, WAITING, fcntl.LOCK_SH)
        return True
    finally:
        if marked:
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, WAITING, os.SEEK_SET)


_turns: dict[str, WriterTurns] = {}
_guard = threading.Lock()


def writer_turns(real_path: str) -> WriterTurns:
    """The write turns of one database file in this process (every store on it shares them)."""
    turns = _turns.get(real_path)  # a dict read is atomic; create under the guard
    if turns is None:
        with _guard:
            turns = _turns.setdefault(real_path, WriterTurns())
    return turns


def _forget_in_child() -> None:
    # A child forked while a parent thread wrote must not inherit a held mutex.
    global _guard
    _guard = threading.Lock()
    _turns.clear()


os.register_at_fork(after_in_child=_forget_in_child)
