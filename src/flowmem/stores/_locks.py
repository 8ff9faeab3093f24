"""MEM-12 key locks for the embedded stores: threads and processes, bounded wait.

A key hashes to one of :data:`STRIPES` stripes. Within a process a stripe is
a :class:`threading.Lock`; across processes it is a POSIX byte-range lock
(``fcntl.lockf``) on one byte of a lock file beside the database. The kernel
releases byte-range locks when a process dies, so a killed writer never
leaves a key locked. Two unrelated keys sharing a stripe are merely
serialized together.

POSIX byte-range locks belong to the process and are dropped when ANY file
descriptor of the file is closed, so there is one descriptor and one set of
thread locks per lock file per process (:func:`key_locks`).

One more byte, past the stripes, is the *setup* lock (:meth:`KeyLocks.setup`):
the SQLite store opens a database (and creates its schema) under it, so that any number
of processes opening one database at once take turns instead of failing.
A lock file flowmem creates is ``0600`` whatever the umask. Its contents, one
byte per stripe, are the published holds of :mod:`._holds` (an SQLite append
reads them instead of taking its key's lock).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager, asynccontextmanager
from typing import Final

from ..scopes import StorageKey, conversation_key
from ._holds import Holds, map_holds

try:  # POSIX only; elsewhere the locks serialize threads of one process
    import fcntl
except ImportError:  # pragma: no cover - not on Linux
    fcntl = None  # type: ignore[assignment]

__all__ = ["POLL_INTERVAL", "SETUP", "STRIPES", "KeyLocks", "key_locks", "polled", "stripe_of"]

STRIPES: Final = 1 << 16
SETUP: Final = STRIPES
"""The byte of the setup lock (after the stripes ``0 .. STRIPES - 1``)."""
POLL_INTERVAL: Final = 0.001
"""How often :func:`polled` tries a blocking lock again from the event loop."""
_POLL_START: Final = 0.0005
_POLL_MAX: Final = 0.02


def stripe_of(key: StorageKey) -> int:
    """The stripe a storage key locks (stable across processes and machines)."""
    return conversation_key(key) % STRIPES


class KeyLocks:
    """Per-key locks with a bounded wait, optionally backed by a lock file."""

    def __init__(self, path: str | None = None) -> None:
        self._guard = threading.Lock()
        self._threads: dict[int, threading.Lock] = {}
        self._fd: int | None = None
        self.holds: Holds | None = None
        """The published holds of the lock file (:mod:`._holds`); ``None``: none kept."""
        if path is not None and fcntl is not None:
            self._fd = _open_lock_file(path)
            self.holds = map_holds(self._fd, STRIPES)

    def names(self, path: str) -> bool:
        """Whether ``path`` still names the lock file this object has open."""
        if self._fd is None:
            return True
        try:
            now = os.stat(path)
        except FileNotFoundError:
            return False
        mine = os.fstat(self._fd)
        return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)

    def thread_lock(self, stripe: int) -> threading.Lock:
        """The in-process half of a stripe's lock: the whole of it when there is no lock file."""
        lock = self._threads.get(stripe)  # a dict read is atomic; create under the guard
        if lock is None:
            with self._guard:
                lock = self._threads.setdefault(stripe, threading.Lock())
        return lock

    def hold(self, key: StorageKey, timeout: float) -> _Hold:
        """Hold ``key``'s lock; entering yields ``False`` if it was not had within ``timeout``."""
        return _Hold(self, stripe_of(key), max(timeout, 0.0))

    def hold_stripe(self, stripe: int, timeout: float) -> _Hold:
        """Hold one stripe (a group of appends takes its stripes once each, in order)."""
        return _Hold(self, stripe, max(timeout, 0.0))

    def setup(self, timeout: float) -> _Hold:
        """Hold the setup lock (opening a database, creating its schema); yields whether it
        was had."""
        return _Hold(self, SETUP, max(timeout, 0.0))

    def _lock_file(self, stripe: int, deadline: float) -> bool:
        if self._fd is None:
            return True
        delay = _POLL_START
        while True:
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, stripe, os.SEEK_SET)
                return True
            except OSError:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                time.sleep(min(delay, remaining))
                delay = min(delay * 2, _POLL_MAX)

    def _unlock_file(self, stripe: int) -> None:
        if self._fd is not None:
            fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, stripe, os.SEEK_SET)


def _open_lock_file(path: str) -> int:
    """Open (or create ``0600``, umask-independent) the lock file."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return os.open(path, os.O_RDWR | os.O_CLOEXEC)
    os.fchmod(fd, 0o600)  # the umask may have taken bits away; an existing file is left alone
    return fd


class _Hold:
    """The context of one :meth:`KeyLocks.hold` (a class: this is the append's hot path)."""

    __slots__ = ("_file_locked", "_locks", "_stripe", "_thread_lock", "_timeout")

    def __init__(self, locks: KeyLocks, stripe: int, timeout: float) -> None:
        self._locks = locks
        self._stripe = stripe
        self._timeout = timeout
        self._thread_lock: threading.Lock | None = None
        self._file_locked = False

    def __enter__(self) -> bool:
        locks, stripe = self._locks, self._stripe
        # the timeout bounds both waits, from when the first one began (the clock is
        # read only when a lock is not had at once: the common case waits for none)
        start: float | None = None
        thread_lock = locks._threads.get(stripe) or locks.thread_lock(stripe)
        if not thread_lock.acquire(False):
            start = time.monotonic()
            if not thread_lock.acquire(True, self._timeout):
                return False
        self._thread_lock = thread_lock
        fd = locks._fd
        if fd is None:
            return True
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, stripe, os.SEEK_SET)
        except OSError:
            deadline = (time.monotonic() if start is None else start) + self._timeout
            if not locks._lock_file(stripe, deadline):
                self._release()
                return False
        self._file_locked = True
        return True

    def __exit__(self, *exc_info: object) -> None:
        self._release()

    def _release(self) -> None:
        if self._file_locked:
            self._file_locked = False
            self._locks._unlock_file(self._stripe)
        if self._thread_lock is not None:
            self._thread_lock.release()
            self._thread_lock = None


_registry: dict[str, KeyLocks] = {}
_registry_guard = threading.Lock()


def _fresh_thread_locks_in_child() -> None:
    # Thread locks held by the parent's other threads at fork() would stay held
    # forever in the child; its byte-range locks are not inherited anyway.
    global _registry_guard
    _registry_guard = threading.Lock()
    for locks in _registry.values():
        locks._guard = threading.Lock()
        locks._threads = {}


os.register_at_fork(after_in_child=_fresh_thread_locks_in_child)


def key_locks(path: str) -> KeyLocks:
    """The process-wide :class:`KeyLocks` of one lock file (see the module notes).

    If the lock file was deleted or replaced since this process opened it
    (``rm x.db*``), a new one is opened: the old descriptor stays open (closing
    it would drop the locks still held through it) but is no longer handed out.
    """
    real = os.path.realpath(path)
    with _registry_guard:
        locks = _registry.get(real)
        if locks is None or not locks.names(real):
            locks = _registry[real] = KeyLocks(real)
        return locks


@asynccontextmanager
async def polled(hold: Callable[[float], AbstractContextManager[bool]],
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
        await asyncio.sleep(POLL_INTERVAL)
    try:
        yield True
    finally:
        held.__exit__(None, None, None)
