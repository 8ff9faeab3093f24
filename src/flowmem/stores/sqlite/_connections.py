"""A SQLite store's connections to its file: one per thread, opened in turn, checked.

:class:`SQLiteConnections` is the part of :class:`~flowmem.stores.sqlite.SQLiteStore`
that opens and closes: each thread's connection (with its one cursor, its programs and
hot buffers: :mod:`._view_cache`) is opened under the *setup* lock of the ``.lock``
file and retried while SQLite answers busy, for at most ``busy_timeout``; its schema is
checked before anything is written (:mod:`._schema`); the path is checked, by a
``stat``, to still name the file the connections have open
(:meth:`~SQLiteConnections._check_file`). The store's transactions and the Store
protocol are in :mod:`._store`, which sets every attribute declared here. The writers
of one file in this process take turns on one mutex (:func:`writers_mutex`).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from ...errors import StoreBusy, StoreError, StoreUnavailable
from .._locks import KeyLocks
from ._errors import is_busy, mapped_error
from ._files import DatabaseFiles, FileIdentity
from ._programs import SQLiteConversations
from ._schema import check
from ._view_cache import HotBuffers

__all__ = ["SQLiteConnections", "writers_mutex"]

logger = logging.getLogger("flowmem")
_T = TypeVar("_T")


class SQLiteConnections:
    """Opening, checking and closing a SQLite store's per-thread connections."""

    path: str
    synchronous: str
    busy_timeout: float
    read_only: bool
    _files: DatabaseFiles
    _uri: str
    _locks: KeyLocks
    _local: threading.local
    _connections: list[sqlite3.Connection]
    _guard: threading.Lock
    _closed: bool
    _gone: str | None  # why the store is unusable (its file was replaced)
    _identity: FileIdentity | None

    def _open_read_only(self) -> None:
        if not self._files.exists():
            raise StoreUnavailable(f"{self.path} does not exist (a read-only store never "
                                   f"creates it)")
        self._retrying(self._connection)  # its schema checked (never created)

    def _retrying(self, action: Callable[[], _T]) -> _T:
        """``action``, again while SQLite answers busy, for at most ``busy_timeout``.

        Opening and switching to WAL can answer "database is locked" at once
        (SQLite does not wait in every case); opens take turns under the
        setup lock, and this covers other programs using the file.
        """
        deadline = time.monotonic() + self.busy_timeout
        delay = 0.001
        while True:
            try:
                return action()
            except (sqlite3.OperationalError, StoreBusy) as exc:
                remaining = deadline - time.monotonic()
                busy = isinstance(exc, StoreBusy) or is_busy(exc)
                if not busy or remaining <= 0:
                    if isinstance(exc, StoreError):
                        raise
                    raise mapped_error(exc, self.path) from exc
                time.sleep(min(delay, remaining))
                delay = min(delay * 2, 0.05)

    def _connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        if self._closed:
            raise StoreError("the store is closed")
        if self._gone is not None:
            raise StoreUnavailable(self._gone)
        if self.read_only:
            conn = self._retrying(self._connect)
        else:
            with self._locks.setup(self.busy_timeout) as had:
                if not had:
                    raise StoreBusy(f"{self.path}: no turn to open a connection within "
                                    f"{self.busy_timeout}s (busy_timeout)")
                conn = self._retrying(self._connect)
        self._adopt(conn)
        return conn

    def _adopt(self, conn: sqlite3.Connection) -> None:
        """Make ``conn`` this thread's connection (closed by :meth:`close`), with its
        own programs and hot buffers (:mod:`._view_cache`; none read-only)."""
        self._local.conn = conn
        self._local.cursor = conn.cursor()  # every transaction's: not one per transaction
        self._local.sql = SQLiteConversations(None if self.read_only else HotBuffers())
        with self._guard:
            self._connections.append(conn)

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self._uri, uri=True, timeout=self.busy_timeout,
                                   isolation_level=None, check_same_thread=False)
        except sqlite3.OperationalError:
            if not self._files.exists():
                self._check_file()  # raises: the file is gone
            raise
        try:
            check(conn, self.path, read_only=self.read_only)  # before WAL: a refused file
            if not self.read_only:                            # is left as it was
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous.upper()}")
            conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()  # the file is read
            if self._identity is None:
                self._identity = self._files.identity()
            self._check_file()
        except BaseException:
            conn.close()
            raise
        return conn

    def _check_file(self) -> None:
        """Raise :class:`StoreUnavailable` (for good) if the path no longer names our file.

        One ``stat`` per transaction: a commit into a deleted or replaced file
        must never be acknowledged. The check runs after the commit, so a
        deletion racing with the commit is caught too.
        """
        if self._gone is None and self._files.names(self._identity):
            return
        if self._gone is None:
            self._gone = (f"the database file {self.path} was deleted or replaced while open: "
                          f"this operation is not in the database at that path, and this store "
                          f"refuses every operation from now on (a new store opens whatever "
                          f"the path names)")
            logger.error("flowmem: %s", self._gone)
        raise StoreUnavailable(self._gone)

    def close(self) -> None:
        with self._guard:
            self._closed = True
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.close()
        self._local = threading.local()


_writers: dict[str, threading.Lock] = {}
_writers_guard = threading.Lock()


def writers_mutex(real_path: str) -> threading.Lock:
    """The mutex the writers of one database file in this process take turns on (every
    store on the file shares it)."""
    mutex = _writers.get(real_path)  # a dict read is atomic; create under the guard
    if mutex is None:
        with _writers_guard:
            mutex = _writers.setdefault(real_path, threading.Lock())
    return mutex


def _forget_writers_in_child() -> None:
    # A child forked while a parent thread wrote must not inherit a held mutex.
    global _writers_guard
    _writers_guard = threading.Lock()
    _writers.clear()


os.register_at_fork(after_in_child=_forget_writers_in_child)
