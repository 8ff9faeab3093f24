"""``postgresql://user@host:port/db`` — the store for many workers on many machines.

One row per message (see :mod:`flowmem.stores.sql`, whose statements this
store runs unchanged); an append is one ``READ COMMITTED`` transaction of
indexed statements. Tables live in a dedicated schema, created and upgraded
by :func:`flowmem.stores.postgres_schema.migrate` when the store opens.

URL options (the rest of the query string goes to libpq, e.g. ``sslmode``)::

    postgresql://user@host:5432/db?schema=flowmem&pool_min=1&pool_max=10&pool_timeout=30

``schema``
    The schema holding flowmem's tables (default ``flowmem``).
``pool_min`` / ``pool_max``
    Connections kept open / opened at most by this store (default 1 / 10).
``pool_timeout``
    Seconds an operation waits for a free connection (default 30).

Transaction pooling (pgbouncer ``pool_mode = transaction``) works: no
statement is prepared (``prepare_threshold=None``) and no session state is
set — the search path and lock timeout are ``SET LOCAL``, the MEM-12 lock is
transaction-level. Each transaction starts with one round trip that carries
``BEGIN``, the search path and, for an append, the lock.

MEM-12: an append sets ``lock_timeout`` to its bounded wait, makes a
savepoint and takes ``pg_advisory_xact_lock`` on a 64-bit hash of (schema,
scope, scope id, key). Exactly the lock-timeout error
(:class:`psycopg.errors.LockNotAvailable`) is caught: the transaction rolls
back to the savepoint and the append goes ahead unserialized
(``serialized=False``; :class:`~flowmem.Memory` logs the warning). The lock
timeout is then reset and the buffer row is read ``FOR UPDATE``, so the
fallback is still atomic — it may interleave with a serialized append but
never loses or doubles a turn; the (buffer, result id) unique key makes a
doubled result impossible. The lock is released at commit or rollback, and
by the server when a client dies.

Failures: connection loss (or the server going away) raises
:class:`~flowmem.errors.StoreUnavailable`, any other server error
:class:`~flowmem.errors.StoreError`; the transaction is rolled back, so the
buffer is as it was. If the connection is lost while ``COMMIT`` is in flight
the outcome is unknown to the client and the error says so. A pooled
connection found dead on the first round trip (nothing sent yet but
``BEGIN``) is replaced once, after checking the pool, before giving up.

The asyncio twin is :mod:`flowmem.stores.postgres_async`; both run the same
SQL programs (:mod:`flowmem.stores.sql`) and the same first round trip
(:mod:`flowmem.stores.postgres_common`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from typing import Any

from ..errors import InvalidStoreURL, MissingDependency, StoreError, StoreUnavailable

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg_pool import ConnectionPool
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency(exc.name or "psycopg", "postgres") from exc

from ..messages import Message
from ..scopes import StorageKey
from ..store import AppendOutcome, HistoryPage, Idempotency
from .postgres_common import (
    EDIT_LOCK_TIMEOUT,
    SQL,
    WRITE_LOCK_TIMEOUT,
    PostgresOptions,
    advisory_key,
    begin_statement,
    broken,
    connect_kwargs,
    lock_fallback_statement,
    mapped,
    pg,
)
from .postgres_schema import migrate, quoted_schema
from .sql import Execute, Program, T, drive, encode

__all__ = ["PostgresStore", "advisory_key", "setup"]

Row = tuple[Any, ...]
Connection = psycopg.Connection[Row]
Cursor = psycopg.Cursor[Row]


def _executor(cur: Cursor) -> Execute:
    def run(statement: str, params: Sequence[Any]) -> list[Row]:
        cur.execute(pg(statement), tuple(params))
        return cur.fetchall() if cur.description is not None else []

    return run


def setup(options: PostgresOptions) -> None:
    """Connect once (failing fast when unreachable) and run the migrations."""
    try:
        conn = psycopg.connect(options.conninfo, **connect_kwargs(options.conninfo))
    except psycopg.ProgrammingError as exc:
        raise InvalidStoreURL(f"unusable PostgreSQL URL: {exc}") from exc
    except psycopg.Error as exc:
        raise StoreUnavailable(f"cannot connect to PostgreSQL: {exc}") from exc
    try:
        encoding = conn.info.parameter_status("server_encoding")
        if encoding != "UTF8":
            raise StoreError(f"flowmem needs a UTF8 database; this one is {encoding!r}")
        migrate(conn.cursor(), options.schema)
    except psycopg.Error as exc:
        raise mapped(exc, lost=broken(conn)) from exc
    finally:
        conn.close()


class PostgresStore:
    """The PostgreSQL backend (see the module notes for pooling and locking)."""

    def __init__(self, conninfo: str, *, schema: str = "flowmem", pool_min: int = 1,
                 pool_max: int = 10, pool_timeout: float = 30.0) -> None:
        self._init(PostgresOptions(conninfo, schema, pool_min, pool_max, pool_timeout))

    def _init(self, options: PostgresOptions) -> None:
        self.schema = options.schema
        self._ident = quoted_schema(options.schema)
        setup(options)
        self._pool: ConnectionPool[Connection] = ConnectionPool(
            options.conninfo, kwargs=connect_kwargs(options.conninfo),
            min_size=options.pool_min, max_size=options.pool_max,
            timeout=options.pool_timeout, open=True, name=f"flowmem-{options.schema}")

    @classmethod
    def from_url(cls, url: str) -> PostgresStore:
        """``postgresql://user@host:port/db?schema=...&pool_max=...`` (see the module notes)."""
        store = cls.__new__(cls)
        store._init(PostgresOptions.from_url(url))
        return store

    # -- transactions ---------------------------------------------------------------
    def _begin(self, cur: Cursor, read_only: bool,
               lock: tuple[StorageKey, float] | None) -> bool:
        """The first round trip; whether the MEM-12 lock was had."""
        held = None if lock is None else (advisory_key(self.schema, lock[0]), lock[1])
        try:
            cur.execute(begin_statement(self._ident, read_only, held))
        except pg_errors.LockNotAvailable:
            cur.execute(lock_fallback_statement())
            return False
        if held is None or held[1] > 0:
            return True
        while cur.nextset():
            pass
        row = cur.fetchone()
        return bool(row and row[0])

    @contextmanager
    def _transaction(self, *, read_only: bool = False, lock: tuple[StorageKey, float] | None = None,
                     ) -> Iterator[tuple[Execute, bool]]:
        conn: Connection | None = None
        committing = False
        try:
            for attempt in (1, 2):
                conn = self._pool.getconn()
                try:
                    serialized = self._begin(conn.cursor(), read_only, lock)
                    break
                except psycopg.Error:
                    if not broken(conn):
                        with suppress(psycopg.Error):
                            conn.execute("ROLLBACK")
                        raise
                    if attempt == 2:
                        raise
                    self._pool.putconn(conn)  # a stale pooled connection: nothing was done
                    conn = None
                    self._pool.check()
            assert conn is not None
            try:
                cur = conn.cursor()
                yield _executor(cur), serialized
                committing = True
                cur.execute("COMMIT")
            except BaseException:
                if not committing and not broken(conn):
                    with suppress(psycopg.Error):
                        conn.execute("ROLLBACK")
                raise
        except psycopg.Error as exc:
            raise mapped(exc, lost=conn is not None and broken(conn),
                         committing=committing) from exc
        finally:
            if conn is not None:
                with suppress(psycopg.Error):
                    self._pool.putconn(conn)

    def _run(self, program: Program[T], *, read_only: bool = False,
             lock: tuple[StorageKey, float] | None = None) -> T:
        with self._transaction(read_only=read_only, lock=lock) as (run, _):
            return drive(program, run)

    # -- the Store protocol ------------------------------------------------------
    def read(self, key: StorageKey) -> tuple[bool, Any]:
        return self._run(SQL.read(key), read_only=True)

    def write(self, key: StorageKey, value: Any, *,
              idempotency: Idempotency | None = None) -> None:
        self._run(SQL.write(key, encode(value), idempotency), lock=(key, WRITE_LOCK_TIMEOUT))

    def delete(self, key: StorageKey, *, idempotency: Idempotency | None = None) -> bool:
        return self._run(SQL.delete(key, idempotency), lock=(key, WRITE_LOCK_TIMEOUT))

    def append(self, key: StorageKey, incoming: Sequence[Message], *,
               max_messages: int | None, lock_timeout: float,
               idempotency: Idempotency | None = None) -> AppendOutcome:
        with self._transaction(lock=(key, lock_timeout)) as (run, serialized):
            program = SQL.append(key, incoming, max_messages, serialized, idempotency)
            return drive(program, run)

    def history(self, key: StorageKey, *, last: int | None = None,
                before: int | None = None) -> HistoryPage:
        return self._run(SQL.history(key, last, before), read_only=True)

    def edit(self, key: StorageKey, position: int, message: Message | None) -> bool:
        return self._run(SQL.edit(key, position, message), lock=(key, EDIT_LOCK_TIMEOUT))

    def keys(self, scope: str, scope_id: str, *, prefix: str = "",
             after: str | None = None, limit: int = 100) -> list[str]:
        return self._run(SQL.keys(scope, scope_id, prefix, after, limit), read_only=True)

    def lock(self, key: StorageKey, timeout: float) -> AbstractContextManager[bool]:
        """Hold ``key``'s advisory lock in a transaction of its own while the block runs."""
        return self._hold(key, timeout)

    @contextmanager
    def _hold(self, key: StorageKey, timeout: float) -> Iterator[bool]:
        with self._transaction(lock=(key, timeout)) as (_, serialized):
            yield serialized

    def close(self) -> None:
        self._pool.close()
