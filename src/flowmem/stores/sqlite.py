"""``sqlite:///path.db`` — the embedded default store.

One row per message (see :mod:`flowmem.stores.sql`); an append is one
``BEGIN IMMEDIATE`` transaction of indexed statements, so its cost does not
grow with the conversation. The journal is WAL; each thread has its own
connection (``isolation_level=None``: flowmem issues ``BEGIN``/``COMMIT``
itself) with a busy timeout.

Durability — the ``synchronous`` URL option (``?synchronous=full``):

``full`` (default)
    Each commit is fsynced before the append returns: an acknowledged append
    survives a process kill, an OS crash and a power cut.
``normal``
    WAL is fsynced at checkpoints only: an acknowledged append survives a
    process kill (``kill -9``), but the last commits before an OS crash or a
    power cut may be rolled back. The database is never corrupted. About 30×
    faster per commit on a typical disk.
``off``
    No fsync at all: a process kill is still safe, an OS crash or power cut
    may corrupt the database. For throw-away data only.

MEM-12: appends to one conversation are serialized by a per-key lock shared
by threads and processes (:mod:`flowmem.stores.locks`), with a bounded wait;
the unserialized fallback is still one ``BEGIN IMMEDIATE`` transaction, and
the (buffer, result id) unique key makes a doubled result impossible.
"""

from __future__ import annotations

import math
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Final
from urllib.parse import parse_qs, unquote, urlsplit

from ..errors import InvalidStoreURL, SchemaError, StoreBusy, StoreError
from ..messages import Message
from ..scopes import StorageKey
from ..store import AppendOutcome, HistoryPage, Idempotency
from .locks import key_locks
from .sql import Execute, Program, SQLConversations, T, drive, encode

__all__ = ["MIGRATIONS", "MIN_SQLITE_VERSION", "SQLiteStore"]

MIN_SQLITE_VERSION: Final = (3, 35, 0)  # UPSERT on a partial index + RETURNING
SYNCHRONOUS: Final = ("full", "normal", "off")

MIGRATIONS: Final[tuple[str, ...]] = (
    """
    CREATE TABLE kv (
        scope TEXT NOT NULL, scope_id TEXT NOT NULL, key TEXT NOT NULL,
        value TEXT NOT NULL,
        PRIMARY KEY (scope, scope_id, key)
    ) WITHOUT ROWID;
    CREATE TABLE buffers (
        id INTEGER PRIMARY KEY,
        scope TEXT NOT NULL, scope_id TEXT NOT NULL, key TEXT NOT NULL,
        count INTEGER NOT NULL DEFAULT 0,
        next_pos INTEGER NOT NULL DEFAULT 0,
        UNIQUE (scope, scope_id, key)
    );
    CREATE TABLE messages (
        buffer_id INTEGER NOT NULL,
        pos INTEGER NOT NULL,
        role TEXT NOT NULL,
        result_id TEXT,
        healed INTEGER NOT NULL DEFAULT 0,
        body TEXT NOT NULL,
        UNIQUE (buffer_id, pos)
    );
    CREATE UNIQUE INDEX messages_result ON messages (buffer_id, result_id)
        WHERE result_id IS NOT NULL;
    CREATE TABLE calls (
        buffer_id INTEGER NOT NULL, call_id TEXT NOT NULL,
        turn_pos INTEGER NOT NULL, ord INTEGER NOT NULL,
        PRIMARY KEY (buffer_id, call_id, turn_pos)
    ) WITHOUT ROWID;
    CREATE INDEX calls_turn ON calls (buffer_id, turn_pos);
    CREATE TABLE pending (
        buffer_id INTEGER NOT NULL, call_id TEXT NOT NULL,
        turn_pos INTEGER NOT NULL, ord INTEGER NOT NULL,
        PRIMARY KEY (buffer_id, call_id)
    ) WITHOUT ROWID;
    """,
    """
    CREATE TABLE idempotency (
        ikey TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, outcome TEXT,
        expires REAL NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX idempotency_expires ON idempotency (expires);
    """,
)
"""Schema migrations; ``PRAGMA user_version`` is the number applied."""


def _check_library() -> None:
    if sqlite3.sqlite_version_info < MIN_SQLITE_VERSION:
        wanted = ".".join(map(str, MIN_SQLITE_VERSION))
        raise StoreError(f"SQLite {sqlite3.sqlite_version} is too old; flowmem needs {wanted}+")


class SQLiteStore:
    """The SQLite backend (see the module notes for durability and locking)."""

    def __init__(self, path: str, *, synchronous: str = "full",
                 busy_timeout: float = 30.0) -> None:
        _check_library()
        if synchronous not in SYNCHRONOUS:
            raise InvalidStoreURL(f"synchronous must be one of {SYNCHRONOUS}, got {synchronous!r}")
        self.path = os.path.abspath(path)
        self.synchronous = synchronous
        self.busy_timeout = busy_timeout
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._guard = threading.Lock()
        self._closed = False
        directory = os.path.dirname(self.path)
        if not os.path.isdir(directory):
            raise StoreError(f"cannot open {self.path}: directory {directory} does not exist")
        try:
            self._locks = key_locks(self.path + ".lock")
            self._real_path = os.path.realpath(self.path)
        except OSError as exc:
            raise StoreError(f"cannot open the lock file {self.path}.lock: {exc}") from exc
        self._migrate()

    @classmethod
    def from_url(cls, url: str) -> SQLiteStore:
        """``sqlite:///relative.db`` or ``sqlite:////absolute.db``, options as query."""
        parts = urlsplit(url)
        path = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
        if parts.netloc or not path:
            raise InvalidStoreURL(f"expected sqlite:///relative/path.db or "
                                  f"sqlite:////absolute/path.db, got {url!r}")
        options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        unknown = set(options) - {"synchronous", "busy_timeout"}
        if unknown:
            raise InvalidStoreURL(f"unknown sqlite option(s): {', '.join(sorted(unknown))}")
        try:
            timeout = float(options.get("busy_timeout", 30.0))
        except ValueError:
            timeout = math.nan
        if not math.isfinite(timeout) or timeout < 0:
            raise InvalidStoreURL(f"busy_timeout must be a number of seconds >= 0, in {url!r}")
        return cls(path, synchronous=options.get("synchronous", "full").lower(),
                   busy_timeout=timeout)

    # -- connections and transactions ------------------------------------------
    def _connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        if self._closed:
            raise StoreError("the store is closed")
        try:
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout,
                                   isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous.upper()}")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open {self.path}: {exc}") from exc
        self._local.conn = conn
        with self._guard:
            self._connections.append(conn)
        return conn

    @contextmanager
    def _transaction(self, mode: str = "IMMEDIATE") -> Iterator[Execute]:
        # Writers of this process queue on one mutex instead of sleeping in
        # SQLite's busy handler (which backs off up to 100 ms); other processes
        # still meet at BEGIN IMMEDIATE. An optimisation only: the database's
        # own write lock is what makes a transaction atomic.
        mutex = _writer_mutex(self._real_path) if mode == "IMMEDIATE" else None
        if mutex is not None and not mutex.acquire(timeout=self.busy_timeout):
            raise StoreBusy(f"no write turn on {self.path} within {self.busy_timeout}s")
        try:
            with self._begun(mode) as sql:
                yield sql
        finally:
            if mutex is not None:
                mutex.release()

    @contextmanager
    def _begun(self, mode: str) -> Iterator[Execute]:
        conn = self._connection()
        try:
            conn.execute(f"BEGIN {mode}")
        except sqlite3.OperationalError as exc:
            raise _mapped(exc) from exc
        try:
            yield lambda sql, params: conn.execute(sql, params).fetchall()
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise _mapped(exc) from exc
            raise

    def _migrate(self) -> None:
        with self._transaction() as run:
            version = int(run("PRAGMA user_version", ())[0][0])
            if version > len(MIGRATIONS):
                raise SchemaError(f"{self.path} has schema version {version}; this flowmem "
                                  f"knows {len(MIGRATIONS)} — upgrade flowmem")
            conn = self._connection()
            for number in range(version, len(MIGRATIONS)):
                for statement in MIGRATIONS[number].split(";"):
                    if statement.strip():
                        conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {len(MIGRATIONS)}")

    def _run(self, program: Program[T], mode: str = "IMMEDIATE") -> T:
        with self._transaction(mode) as run:
            return drive(program, run)

    # -- the Store protocol ------------------------------------------------------
    def read(self, key: StorageKey) -> tuple[bool, Any]:
        return self._run(_SQL.read(key), "DEFERRED")

    def write(self, key: StorageKey, value: Any, *,
              idempotency: Idempotency | None = None) -> None:
        self._run(_SQL.write(key, encode(value), idempotency))

    def delete(self, key: StorageKey, *, idempotency: Idempotency | None = None) -> bool:
        return self._run(_SQL.delete(key, idempotency))

    def append(self, key: StorageKey, incoming: Sequence[Message], *,
               max_messages: int | None, lock_timeout: float,
               idempotency: Idempotency | None = None) -> AppendOutcome:
        with self._locks.hold(key, lock_timeout) as serialized:
            return self._run(_SQL.append(key, incoming, max_messages, serialized, idempotency))

    def history(self, key: StorageKey, *, last: int | None = None,
                before: int | None = None) -> HistoryPage:
        return self._run(_SQL.history(key, last, before), "DEFERRED")

    def edit(self, key: StorageKey, position: int, message: Message | None) -> bool:
        with self._locks.hold(key, 30.0):
            return self._run(_SQL.edit(key, position, message))

    def keys(self, scope: str, scope_id: str, *, prefix: str = "",
             after: str | None = None, limit: int = 100) -> list[str]:
        return self._run(_SQL.keys(scope, scope_id, prefix, after, limit), "DEFERRED")

    def lock(self, key: StorageKey, timeout: float) -> AbstractContextManager[bool]:
        return self._locks.hold(key, timeout)

    def integrity_check(self) -> str:
        """``PRAGMA integrity_check``: ``"ok"`` for a sound database file."""
        return str(self._connection().execute("PRAGMA integrity_check").fetchone()[0])

    def close(self) -> None:
        with self._guard:
            self._closed = True
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.close()
        self._local = threading.local()


_SQL: Final = SQLConversations()  # SQLite's BEGIN IMMEDIATE already holds the write lock

_writer_mutexes: dict[str, threading.Lock] = {}
_writer_guard = threading.Lock()


def _writer_mutex(real_path: str) -> threading.Lock:
    """One writer mutex per database file per process (every store on it shares it)."""
    mutex = _writer_mutexes.get(real_path)  # a dict read is atomic; create under the guard
    if mutex is None:
        with _writer_guard:
            mutex = _writer_mutexes.setdefault(real_path, threading.Lock())
    return mutex


def _forget_writers_in_child() -> None:
    # A child forked while a parent thread wrote must not inherit a held mutex.
    global _writer_guard
    _writer_guard = threading.Lock()
    _writer_mutexes.clear()


os.register_at_fork(after_in_child=_forget_writers_in_child)


def _mapped(exc: sqlite3.Error) -> StoreError:
    text = str(exc)
    if isinstance(exc, sqlite3.OperationalError) and "locked" in text:
        return StoreBusy(f"SQLite database stayed locked: {text}")
    return StoreError(f"SQLite error: {text}")
