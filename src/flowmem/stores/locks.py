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
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from ..scopes import StorageKey

try:  # POSIX only; elsewhere the locks serialize threads of one process
    import fcntl
except ImportError:  # pragma: no cover - not on Linux
    fcntl = None  # type: ignore[assignment]

__all__ = ["STRIPES", "KeyLocks", "key_locks", "stripe_of"]

STRIPES: Final = 1 << 16
_POLL_START: Final = 0.0005
_POLL_MAX: Final = 0.02


def stripe_of(key: StorageKey) -> int:
    """The stripe a storage key locks (stable across processes and machines)."""
    raw = "\x00".join((key.scope, key.scope_id, key.key)).encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "big") % STRIPES


class KeyLocks:
    """Per-key locks with a bounded wait, optionally backed by a lock file."""

    def __init__(self, path: str | None = None) -> None:
        self._guard = threading.Lock()
        self._threads: dict[int, threading.Lock] = {}
        self._fd: int | None = None
        if path is not None and fcntl is not None:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)

    def _thread_lock(self, stripe: int) -> threading.Lock:
        with self._guard:
            lock = self._threads.get(stripe)
            if lock is None:
                lock = self._threads[stripe] = threading.Lock()
            return lock

    @contextmanager
    def hold(self, key: StorageKey, timeout: float) -> Iterator[bool]:
        """Hold ``key``'s lock; yields ``False`` if it was not had within ``timeout``."""
        stripe = stripe_of(key)
        deadline = time.monotonic() + max(timeout, 0.0)
        thread_lock = self._thread_lock(stripe)
        if not thread_lock.acquire(timeout=max(timeout, 0.0)):
            yield False
            return
        try:
            if not self._lock_file(stripe, deadline):
                yield False
                return
            try:
                yield True
            finally:
                self._unlock_file(stripe)
        finally:
            thread_lock.release()

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


_registry: dict[str, KeyLocks] = {}
_registry_guard = threading.Lock()


def key_locks(path: str) -> KeyLocks:
    """The process-wide :class:`KeyLocks` of one lock file (see the module notes)."""
    real = os.path.realpath(path)
    with _registry_guard:
        locks = _registry.get(real)
        if locks is None:
            locks = _registry[real] = KeyLocks(real)
        return locks
