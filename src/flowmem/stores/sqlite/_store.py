"""``sqlite:///path.db`` — the embedded default store.

One row per message (see :mod:`flowmem.stores.sql._conversations`); an append is one
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

MEM-12: an append is one ``BEGIN IMMEDIATE`` transaction, and SQLite's write
lock serializes those across threads and processes. An explicit holder of
:meth:`SQLiteStore.lock` publishes its hold (:mod:`flowmem.stores._holds`), and
an append to a held key waits for the per-key lock shared by threads and
processes (:mod:`flowmem.stores._locks`), with a bounded wait; the
unserialized fallback is still one transaction, and the (buffer, result id)
unique key makes a doubled result impossible.

Opening: any number of threads and processes may open one database at once,
new or existing. Creating the file, switching it to WAL and creating the schema run
under the *setup* lock of the ``.lock`` file (one open at a time per
database), and a "database is locked" answer is retried; only past
``busy_timeout`` does an open raise :class:`~flowmem.errors.StoreBusy`.

The connections are opened, checked and closed by this store's base,
:class:`~flowmem.stores.sqlite._connections.SQLiteConnections`.

Faults (:mod:`flowmem.stores.sqlite._files`): a database flowmem creates is
``0600``, with its ``-wal``, ``-shm`` and ``.lock``. Every transaction ends
with a check that the path still names the file: if the file was deleted or
replaced while open, the operation raises
:class:`~flowmem.errors.StoreUnavailable` — a write is never acknowledged into
an unlinked file — and so does every later operation of this store (a new
store opens whatever the path names then). The check is one ``stat`` of the path.
Read-only (``?mode=ro``, or a file this process cannot write): reads and
history work, writes raise :class:`~flowmem.errors.StoreReadOnly`.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Final, TypeVar
from urllib.parse import unquote, urlsplit

from ...errors import (
    InvalidStoreURL,
    SchemaError,
    StoreBusy,
    StoreError,
    StoreReadOnly,
    StoreUnavailable,
)
from ...messages import Message
from ...retention import Expiry, Swept
from ...scopes import StorageKey
from ...store import AppendOutcome, DeleteOutcome, Erased, HistoryPage, Idempotency
from .._codec import encode
from .._holds import Holds, published
from .._locks import KeyLocks, key_locks, stripe_of
from .._urls import URLOptions
from ..sql._conversations import Program, T, drive
from ._append import executor, run_expiring
from ._connections import SQLiteConnections, writers_mutex
from ._errors import mapped_error
from ._files import DatabaseFiles, FileIdentity
from ._group_commit import (
    AppendRequest,
    GroupAborted,
    each_alone,
    group_locks,
    run_group,
    run_unheld,
)
from ._programs import SQLiteConversations
from ._schema import MIN_SQLITE_VERSION, check_header, check_library, prepare

__all__ = ["MIN_SQLITE_VERSION", "SQLiteStore"]

SYNCHRONOUS: Final = ("full", "normal", "off")
_BEGIN: Final = {"IMMEDIATE": "BEGIN IMMEDIATE", "DEFERRED": "BEGIN DEFERRED"}
MODES: Final = ("rwc", "rw", "ro")
_URL_OPTIONS: Final = ("synchronous", "busy_timeout", "mode")
_T = TypeVar("_T")


class SQLiteStore(SQLiteConnections):
    """The SQLite backend (see the module notes for durability, opening and faults).

    ``mode`` is ``"rwc"`` (read-write, create the database when missing; the
    default), ``"rw"`` (read-write, the database must exist) or ``"ro"``
    (read-only). A database this process cannot write is opened read-only
    whatever the mode; :attr:`read_only` tells.
    """

    short_appends = True
    """Run the common hot append by plain calls (:mod:`._append`); ``False`` (tests
    only: the two paths compared) runs every append as the SQL program."""

    def __init__(self, path: str, *, synchronous: str = "full",
                 busy_timeout: float = 30.0, mode: str = "rwc") -> None:
        check_library()
        if synchronous not in SYNCHRONOUS:
            raise InvalidStoreURL(f"synchronous must be one of {SYNCHRONOUS}, got {synchronous!r}")
        if mode not in MODES:
            raise InvalidStoreURL(f"mode must be one of {MODES}, got {mode!r}")
        self.path = os.path.abspath(path)
        self.synchronous = synchronous
        self.busy_timeout = busy_timeout
        self._files = DatabaseFiles(self.path)
        self.read_only = mode == "ro" or self._files.unwritable()
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._guard = threading.Lock()
        self._closed = False
        self._gone: str | None = None  # why the store is unusable (its file was replaced)
        self._identity: FileIdentity | None = None
        directory = os.path.dirname(self.path)
        if not os.path.isdir(directory):
            raise StoreError(f"cannot open {self.path}: directory {directory} does not exist")
        self._writers = writers_mutex(os.path.realpath(self.path))
        # decided once: every connection of the store sees the file the same way
        self._uri = self._files.uri(read_only=self.read_only)
        self._files.refuse_old_files()  # a replaced file's live -wal/-shm: never shared
        if self.read_only:
            self._locks = KeyLocks()  # nothing is written: thread locks suffice
            self._open_read_only()
            return
        if mode == "rw" and not self._files.exists():  # before the lock file is made
            raise StoreUnavailable(f"{self.path} does not exist (mode=rw never creates it)")
        check_header(self.path)  # a file that is not ours: refused before anything is made
        had_lock = os.path.exists(self._files.lock)
        try:
            self._locks = key_locks(self._files.lock)
        except OSError as exc:
            raise StoreError(f"cannot open the lock file {self._files.lock}: {exc}") from exc
        try:
            self._set_up(mode)
        except SchemaError:
            if not had_lock:  # a refused file is left as it was, with nothing beside it
                with contextlib.suppress(OSError):
                    os.unlink(self._files.lock)
            raise

    def _set_up(self, mode: str) -> None:
        """Create (``rwc``) or find the database, and check or create its schema, under the
        setup lock of the lock file."""
        with self._locks.setup(self.busy_timeout) as had:
            if not had:
                raise StoreBusy(f"{self.path}: other processes kept opening it for "
                                f"{self.busy_timeout}s (busy_timeout)")
            if mode == "rwc":
                self._files.create()
            elif not self._files.exists():
                raise StoreUnavailable(f"{self.path} does not exist (mode=rw never creates it)")
            conn = self._retrying(self._connect)
            self._adopt(conn)
            self._retrying(lambda: prepare(conn, self.path))
            self._files.record_identity(self._identity)  # which file -wal/-shm belong to

    @classmethod
    def from_url(cls, url: str) -> SQLiteStore:
        """``sqlite:///relative.db`` or ``sqlite:////absolute.db``, options as query."""
        parts = urlsplit(url)
        path = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
        if parts.netloc or not path:
            raise InvalidStoreURL(f"expected sqlite:///relative/path.db or "
                                  f"sqlite:////absolute/path.db, got {url!r}")
        options = URLOptions(url, _URL_OPTIONS)
        options.refuse_unknown("sqlite", _URL_OPTIONS)
        return cls(path, synchronous=options.text("synchronous", "full").lower(),
                   busy_timeout=options.seconds("busy_timeout", 30.0),
                   mode=options.text("mode", "rwc").lower())

    def _within(self, body: Callable[..., _T], mode: str = "IMMEDIATE", *args: Any) -> _T:
        """``body(cursor, *args)`` in one transaction (plain calls, no context managers:
        the hot path).

        Writers of this process queue on one mutex per database file
        (:func:`~._connections.writers_mutex`) instead of sleeping in SQLite's busy
        handler (which backs off up to 100 ms); other processes' writers meet SQLite's
        write lock and its busy handler, bounded by ``busy_timeout``. The connection
        is had first: opening one takes the setup lock, never under the mutex. After
        the transaction, one ``stat`` checks that the path still names the file.
        """
        if mode == "IMMEDIATE" and self.read_only:
            raise StoreReadOnly(f"{self.path} is open read-only: writes are refused")
        local = self._local
        conn = getattr(local, "conn", None) or self._connection()
        mutex = self._writers if mode == "IMMEDIATE" else None
        if mutex is not None and not mutex.acquire(True, self.busy_timeout):
            raise StoreBusy(f"no write turn on {self.path} within {self.busy_timeout}s")
        try:
            if self._gone is not None:
                raise StoreUnavailable(self._gone)
            cursor: sqlite3.Cursor = local.cursor  # the connection's one cursor
            try:
                cursor.execute(_BEGIN[mode])
            except sqlite3.OperationalError as exc:
                raise mapped_error(exc, self.path) from exc
            try:
                answer = body(cursor, *args)
                cursor.execute("COMMIT")
            except BaseException as exc:
                self._forget_hot()  # what the copy learned may not be in the database
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise mapped_error(exc, self.path) from exc
                raise
        finally:
            if mutex is not None:
                mutex.release()
        if self._gone is not None or not self._files.names(self._identity):
            self._check_file()  # raises
        return answer

    def _run(self, program: Program[T], mode: str = "IMMEDIATE") -> T:
        return self._within(lambda cursor: drive(program, executor(cursor)), mode)

    def _programs(self) -> SQLiteConversations:
        """The programs (and hot buffers) of this thread's connection."""
        self._connection()
        programs: SQLiteConversations = self._local.sql
        return programs

    def _forget_hot(self, key: StorageKey | None = None) -> None:
        """Drop this connection's hot copy of ``key`` (before a write that is not an
        append), or all of them (a failed transaction)."""
        programs: SQLiteConversations | None = getattr(self._local, "sql", None)
        if programs is not None:
            programs.forget_hot(key)

    # -- the Store protocol ------------------------------------------------------
    def read(self, key: StorageKey, *, now: float | None = None) -> tuple[bool, Any]:
        return self._run(_SQL.live_only(_SQL.read(key), key, now, (False, None)), "DEFERRED")

    def write(self, key: StorageKey, value: Any, *,
              idempotency: Idempotency | None = None, replace: bool = False,
              expiry: Expiry | None = None) -> bool:
        self._forget_hot(key)
        return self._run(_SQL.write(key, encode(value), idempotency, replace, expiry))

    def delete(self, key: StorageKey, *,
               idempotency: Idempotency | None = None) -> DeleteOutcome:
        self._forget_hot(key)
        return self._run(_SQL.delete(key, idempotency))

    def append(self, key: StorageKey, incoming: Sequence[Message], *,
               max_messages: int | None, lock_timeout: float,
               idempotency: Idempotency | None = None, tail: int = 0,
               expiry: Expiry | None = None) -> AppendOutcome:
        holds = self._locks.holds
        sql: SQLiteConversations = getattr(self._local, "sql", None) or self._programs()
        if holds is not None:  # unless a holder holds the key, BEGIN IMMEDIATE serializes
            outcome = self._within(_unless_held, "IMMEDIATE", holds, stripe_of(key), sql, key,
                                   incoming, max_messages, idempotency, tail, self.short_appends,
                                   expiry)
            if outcome is not None:
                return outcome
        return self._append_held(sql, key, incoming, max_messages, lock_timeout, idempotency,
                                 tail, expiry)

    def _append_held(self, sql: SQLiteConversations, key: StorageKey,
                     incoming: Sequence[Message], max_messages: int | None,
                     lock_timeout: float, idempotency: Idempotency | None,
                     tail: int, expiry: Expiry | None = None) -> AppendOutcome:
        """An append under its key's MEM-12 lock (an explicit holder holds the key, or the
        store publishes no holds)."""
        holds = self._locks.holds
        with self._locks.hold(key, lock_timeout) as serialized:
            if serialized and holds is not None:
                holds.withdraw(stripe_of(key))  # a holder killed while holding left it
            return self._within(lambda cursor: run_expiring(
                sql, cursor, key, incoming, max_messages, serialized, idempotency, tail,
                expiry, short=self.short_appends))

    def append_group(self, requests: Sequence[AppendRequest]) -> list[AppendOutcome | Exception]:
        """Several appends in ONE transaction (group commit, :mod:`._group_commit`).

        Returns one answer per request, in order: its outcome, or the error that
        refused it alone. Each append is as atomic and as serialized as alone.
        """
        try:
            holds = self._locks.holds
            if holds is not None:
                answers = run_unheld(self._within, holds, self._programs(), requests,
                                     self.short_appends)
                if answers is not None:
                    return answers
            with group_locks(self._locks, requests) as serialized:
                return run_group(self._within, self._programs(), requests, serialized,
                                 self.short_appends)
        except GroupAborted:  # rolled back whole: each append alone gets its own answer
            return each_alone(self.append, requests)

    def history(self, key: StorageKey, *, last: int | None = None,
                before: int | None = None, now: float | None = None) -> HistoryPage:
        return self._run(_SQL.live_only(_SQL.history(key, last, before), key, now,
                                        HistoryPage(total=0)), "DEFERRED")

    def edit(self, key: StorageKey, position: int, message: Message | None) -> bool:
        with self._locks.hold(key, 30.0):
            self._forget_hot(key)
            return self._run(_SQL.edit(key, position, message))

    def keys(self, scope: str, scope_id: str, *, prefix: str = "",
             after: str | None = None, limit: int = 100, now: float | None = None) -> list[str]:
        return self._run(_SQL.keys(scope, scope_id, prefix, after, limit, now), "DEFERRED")

    def touch(self, key: StorageKey, expiry: Expiry) -> bool:
        """Move a live key's expiry (``refresh_on_read``)."""
        return self._run(_SQL.touch(key, expiry))

    def sweep(self, now: float, *, batch: int = 500) -> Swept:
        """Delete up to ``batch`` keys expired by ``now`` in one transaction (retention)."""
        swept = self._run(_SQL.sweep(now, batch))
        if swept.by_scope:
            self._forget_hot()
        return swept

    def erase(self, scope: str, scope_id: str, *, dry_run: bool = False) -> Erased:
        """The fence, then one transaction per key (:mod:`flowmem.stores.sql._erasure`)."""
        self.erase_fence(scope, scope_id, up=True, dry_run=dry_run)
        total, after = Erased(), ""
        while page := self.erase_page(scope, scope_id, after):
            for name in page:
                total += self.erase_key(StorageKey(scope, scope_id, name), dry_run)
            after = page[-1]
        self.erase_fence(scope, scope_id, up=False, dry_run=dry_run)
        return total

    def erase_fence(self, scope: str, scope_id: str, *, up: bool, dry_run: bool) -> None:
        """Raise (``up``) or lower an erasure's fence (a dry run has none)."""
        if not dry_run:
            self._run(_SQL.raise_fence(scope, scope_id) if up
                      else _SQL.lower_fence(scope, scope_id))

    def erase_page(self, scope: str, scope_id: str, after: str) -> list[str]:
        """The next keys an erasure takes (after ``after``)."""
        return [name for name, _ in self._run(_SQL.erasable(scope, scope_id, after),
                                              "DEFERRED")]

    def erase_key(self, key: StorageKey, dry_run: bool) -> Erased:
        """Erase (or count) one key in a transaction of its own."""
        self._forget_hot(key)
        return self._run(_SQL.erase_key(key, dry_run), "DEFERRED" if dry_run else "IMMEDIATE")

    def lock(self, key: StorageKey, timeout: float) -> AbstractContextManager[bool]:
        hold, holds = self._locks.hold(key, timeout), self._locks.holds
        if holds is None:
            return hold
        return published(hold, holds, stripe_of(key), lambda publish: self._within(
            lambda cursor: publish()))

    def integrity_check(self) -> str:
        """``PRAGMA integrity_check``: ``"ok"`` for a sound database file."""
        return str(self._connection().execute("PRAGMA integrity_check").fetchone()[0])

_SQL: Final = SQLiteConversations()  # BEGIN IMMEDIATE already holds the write lock


def _unless_held(cursor: sqlite3.Cursor, holds: Holds, stripe: int, sql: SQLiteConversations,
                 key: StorageKey, incoming: Sequence[Message], max_messages: int | None,
                 idempotency: Idempotency | None, tail: int,
                 short: bool, expiry: Expiry | None = None) -> AppendOutcome | None:
    """An append in ``cursor``'s transaction unless its key's hold is published (read under
    the write lock, :mod:`flowmem.stores._holds`): then ``None``, nothing written."""
    if holds.held(stripe):
        return None
    return run_expiring(sql, cursor, key, incoming, max_messages, True, idempotency, tail,
                        expiry, short=short)
