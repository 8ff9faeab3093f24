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
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..errors import (
    InvalidStoreURL,
    MissingDependency,
    StoreBusy,
    StoreError,
    StoreUnavailable,
)

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg.pq import TransactionStatus
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency("psycopg", "postgres") from exc
try:
    from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency("psycopg_pool", "postgres") from exc

from ..messages import Message
from ..plan import SLOT, plan_append
from ..scopes import StorageKey
from ..store import AppendOutcome, HistoryPage
from .postgres_schema import migrate, quoted_schema
from .sql import Execute, SQLConversations, decode, encode

__all__ = ["PostgresStore", "advisory_key"]

Row = tuple[Any, ...]
Connection = psycopg.Connection[Row]
Cursor = psycopg.Cursor[Row]

OPTIONS: Final = ("schema", "pool_min", "pool_max", "pool_timeout")
WRITE_LOCK_TIMEOUT: Final = 5.0  # write/delete wait this long for the key's lock
EDIT_LOCK_TIMEOUT: Final = 30.0  # the administrative edit, as on SQLite
_MAX_TIMEOUT_MS: Final = 2**31 - 1
_SAVEPOINT: Final = "flowmem_mem12"
_UNAVAILABLE_STATES: Final = ("57P01", "57P02", "57P03")  # shutdown, crash, cannot connect now
_BUSY_STATES: Final = ("55P03", "40P01", "40001")  # lock timeout, deadlock, serialization


def advisory_key(schema: str, key: StorageKey) -> int:
    """The MEM-12 advisory lock id of ``key``: a stable signed 64-bit hash."""
    raw = "\x00".join((schema, key.scope, key.scope_id, key.key))
    digest = hashlib.blake2b(raw.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


@lru_cache(maxsize=1024)
def _pg(statement: str) -> str:
    """A ``?`` statement of :mod:`flowmem.stores.sql` in psycopg's ``%s`` style."""
    return statement.replace("%", "%%").replace("?", "%s")


def _executor(cur: Cursor) -> Execute:
    def run(statement: str, params: Sequence[Any]) -> list[Row]:
        cur.execute(_pg(statement), tuple(params))
        return cur.fetchall() if cur.description is not None else []

    return run


def _timeout_ms(seconds: float) -> int:
    return min(max(1, math.ceil(seconds * 1000)), _MAX_TIMEOUT_MS)


def _broken(conn: Connection) -> bool:
    return conn.closed or conn.info.transaction_status == TransactionStatus.UNKNOWN


def _mapped(exc: psycopg.Error, *, lost: bool = False, committing: bool = False) -> StoreError:
    if isinstance(exc, PoolClosed):
        return StoreError("the PostgreSQL store is closed")
    if isinstance(exc, PoolTimeout):
        return StoreUnavailable(f"no PostgreSQL connection in time (server unreachable "
                                f"or pool exhausted): {exc}")
    state = exc.sqlstate or ""
    if (lost or state.startswith("08") or state in _UNAVAILABLE_STATES
            or (isinstance(exc, psycopg.OperationalError) and not state)):
        if committing:
            return StoreUnavailable(f"PostgreSQL connection lost during COMMIT; the "
                                    f"operation may or may not have been stored: {exc}")
        return StoreUnavailable(f"PostgreSQL connection lost; nothing was stored: {exc}")
    if state in _BUSY_STATES:
        return StoreBusy(f"PostgreSQL lock wait failed ({state}): {exc}")
    return StoreError(f"PostgreSQL error ({state or 'client'}): {exc}")


@dataclass(slots=True)
class _Tx:
    """One transaction: the statements and whether the key's MEM-12 lock was had."""

    sql: SQLConversations
    serialized: bool


class PostgresStore:
    """The PostgreSQL backend (see the module notes for pooling and locking)."""

    def __init__(self, conninfo: str, *, schema: str = "flowmem", pool_min: int = 1,
                 pool_max: int = 10, pool_timeout: float = 30.0) -> None:
        self.schema = schema
        self._ident = quoted_schema(schema)
        if not 0 <= pool_min <= pool_max or pool_max < 1 or pool_timeout <= 0:
            raise InvalidStoreURL(f"need 0 <= pool_min <= pool_max, pool_max >= 1 and "
                                  f"pool_timeout > 0; got {pool_min}, {pool_max}, {pool_timeout}")
        kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": None}
        if "connect_timeout" not in conninfo:
            kwargs["connect_timeout"] = 10
        self._setup(conninfo, kwargs)
        self._pool: ConnectionPool[Connection] = ConnectionPool(
            conninfo, kwargs=kwargs, min_size=pool_min, max_size=pool_max,
            timeout=pool_timeout, open=True, name=f"flowmem-{schema}")

    @classmethod
    def from_url(cls, url: str) -> PostgresStore:
        """``postgresql://user@host:port/db?schema=...&pool_max=...`` (see the module notes)."""
        parts = urlsplit(url)
        if parts.scheme.lower() not in ("postgresql", "postgres"):
            raise InvalidStoreURL(f"not a PostgreSQL URL: {url!r}")
        query = parse_qsl(parts.query, keep_blank_values=True)
        ours = {name: value for name, value in query if name in OPTIONS}
        libpq = [(name, value) for name, value in query if name not in OPTIONS]
        conninfo = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(libpq), ""))
        try:
            pool_min = int(ours.get("pool_min", 1))
            pool_max = int(ours.get("pool_max", 10))
            pool_timeout = float(ours.get("pool_timeout", 30.0))
        except ValueError:
            raise InvalidStoreURL(f"pool_min/pool_max must be integers and pool_timeout "
                                  f"seconds, in {url!r}") from None
        return cls(conninfo, schema=ours.get("schema", "flowmem"), pool_min=pool_min,
                   pool_max=pool_max, pool_timeout=pool_timeout)

    def _setup(self, conninfo: str, kwargs: dict[str, Any]) -> None:
        """Connect once (failing fast when unreachable) and run the migrations."""
        try:
            conn = psycopg.connect(conninfo, **kwargs)
        except psycopg.ProgrammingError as exc:
            raise InvalidStoreURL(f"unusable PostgreSQL URL: {exc}") from exc
        except psycopg.Error as exc:
            raise StoreUnavailable(f"cannot connect to PostgreSQL: {exc}") from exc
        try:
            encoding = conn.info.parameter_status("server_encoding")
            if encoding != "UTF8":
                raise StoreError(f"flowmem needs a UTF8 database; this one is {encoding!r}")
            migrate(conn.cursor(), self.schema)
        except psycopg.Error as exc:
            raise _mapped(exc, lost=_broken(conn)) from exc
        finally:
            conn.close()

    # -- transactions ---------------------------------------------------------------
    def _begin(self, cur: Cursor, read_only: bool,
               lock: tuple[StorageKey, float] | None) -> bool:
        """The first round trip: BEGIN, search path, and the MEM-12 lock; whether it was had."""
        mode = "REPEATABLE READ READ ONLY" if read_only else "READ COMMITTED"
        head = f"BEGIN ISOLATION LEVEL {mode}; SET LOCAL search_path TO {self._ident}"
        if lock is None:
            cur.execute(head)
            return True
        key, timeout = lock
        lock_id = f"'{advisory_key(self.schema, key)}'::bigint"
        if timeout <= 0:
            cur.execute(f"{head}; SELECT pg_try_advisory_xact_lock({lock_id})")
            while cur.nextset():
                pass
            row = cur.fetchone()
            return bool(row and row[0])
        try:
            # set_config(..., NULL, true) = SET LOCAL lock_timeout TO DEFAULT, once the lock is had
            cur.execute(f"{head}; SET LOCAL lock_timeout = {_timeout_ms(timeout)}; "
                        f"SAVEPOINT {_SAVEPOINT}; SELECT pg_advisory_xact_lock({lock_id}), "
                        f"set_config('lock_timeout', NULL, true)")
            return True
        except pg_errors.LockNotAvailable:
            cur.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}; SET LOCAL lock_timeout TO DEFAULT")
            return False

    @contextmanager
    def _transaction(self, *, read_only: bool = False,
                     lock: tuple[StorageKey, float] | None = None) -> Iterator[_Tx]:
        conn: Connection | None = None
        committing = False
        try:
            for attempt in (1, 2):
                conn = self._pool.getconn()
                try:
                    serialized = self._begin(conn.cursor(), read_only, lock)
                    break
                except psycopg.Error:
                    if not _broken(conn):
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
                yield _Tx(SQLConversations(_executor(cur), lock_row=" FOR UPDATE"), serialized)
                committing = True
                cur.execute("COMMIT")
            except BaseException:
                if not committing and not _broken(conn):
                    with suppress(psycopg.Error):
                        conn.execute("ROLLBACK")
                raise
        except psycopg.Error as exc:
            raise _mapped(exc, lost=conn is not None and _broken(conn),
                          committing=committing) from exc
        finally:
            if conn is not None:
                with suppress(psycopg.Error):
                    self._pool.putconn(conn)

    @staticmethod
    def _locked_buffer(tx: _Tx, key: StorageKey) -> int | None:
        rows = tx.sql.run("SELECT id FROM buffers WHERE scope = ? AND scope_id = ? AND key = ? "
                          "FOR UPDATE", (key.scope, key.scope_id, key.key))
        return int(rows[0][0]) if rows else None

    # -- the Store protocol ------------------------------------------------------
    def read(self, key: StorageKey) -> tuple[bool, Any]:
        with self._transaction(read_only=True) as tx:
            rows = tx.sql.run("SELECT value FROM kv WHERE scope = ? AND scope_id = ? "
                              "AND key = ?", (key.scope, key.scope_id, key.key))
            if rows:
                return True, decode(rows[0][0])
            buffer_id = tx.sql.buffer_id(key)
            if buffer_id is None:
                return False, None
            return True, tx.sql.messages(buffer_id)

    def write(self, key: StorageKey, value: Any) -> None:
        text = encode(value)
        with self._transaction(lock=(key, WRITE_LOCK_TIMEOUT)) as tx:
            buffer_id = self._locked_buffer(tx, key)
            if buffer_id is not None:
                tx.sql.drop_buffer(buffer_id)
            tx.sql.run("INSERT INTO kv (scope, scope_id, key, value) VALUES (?, ?, ?, ?) "
                       "ON CONFLICT (scope, scope_id, key) DO UPDATE SET value = excluded.value",
                       (key.scope, key.scope_id, key.key, text))

    def delete(self, key: StorageKey) -> bool:
        with self._transaction(lock=(key, WRITE_LOCK_TIMEOUT)) as tx:
            found = bool(tx.sql.run("DELETE FROM kv WHERE scope = ? AND scope_id = ? "
                                    "AND key = ? RETURNING 1", (key.scope, key.scope_id, key.key)))
            buffer_id = self._locked_buffer(tx, key)
            if buffer_id is not None:
                tx.sql.drop_buffer(buffer_id)
                found = True
            return found

    def append(self, key: StorageKey, incoming: Sequence[Message], *,
               max_messages: int | None, lock_timeout: float) -> AppendOutcome:
        with self._transaction(lock=(key, lock_timeout)) as tx:
            buffer_id, count, next_pos = tx.sql.open_buffer(key)
            plan = plan_append(tx.sql.view(buffer_id, incoming), incoming)
            count, appended = tx.sql.apply(buffer_id, count, next_pos, plan, SLOT, max_messages)
            return AppendOutcome(count, appended, tx.serialized)

    def history(self, key: StorageKey, *, last: int | None = None,
                before: int | None = None) -> HistoryPage:
        with self._transaction(read_only=True) as tx:
            buffer_id = tx.sql.buffer_id(key)
            if buffer_id is None:
                return HistoryPage()
            return tx.sql.history(buffer_id, last, before)

    def edit(self, key: StorageKey, position: int, message: Message | None) -> bool:
        with self._transaction(lock=(key, EDIT_LOCK_TIMEOUT)) as tx:
            buffer_id = self._locked_buffer(tx, key)
            return buffer_id is not None and tx.sql.edit(buffer_id, position, message)

    def keys(self, scope: str, scope_id: str, *, prefix: str = "",
             after: str | None = None, limit: int = 100) -> list[str]:
        with self._transaction(read_only=True) as tx:
            return tx.sql.keys(scope, scope_id, prefix, after, limit)

    def lock(self, key: StorageKey, timeout: float) -> AbstractContextManager[bool]:
        """Hold ``key``'s advisory lock in a transaction of its own while the block runs."""
        return self._hold(key, timeout)

    @contextmanager
    def _hold(self, key: StorageKey, timeout: float) -> Iterator[bool]:
        with self._transaction(lock=(key, timeout)) as tx:
            yield tx.serialized

    def close(self) -> None:
        self._pool.close()
