"""What the blocking and the asyncio PostgreSQL stores share: the URL, the
bounds of every wait, the MEM-12 lock id, the first round trip's statements
and the error mapping.

Only the I/O differs between :mod:`flowmem.stores.postgres` and
:mod:`flowmem.stores.postgres_async`; the SQL of every operation is the
programs of :mod:`flowmem.stores.sql`.

The bounds (each overridable in the URL; see :mod:`flowmem.stores.postgres`):

- waiting for a pooled connection: ``pool_timeout`` (5 s);
- opening a connection: libpq's ``connect_timeout`` (5 s);
- a dead peer or network: TCP keepalives (``keepalives_idle=5``,
  ``keepalives_interval=2``, ``keepalives_count=3``) and ``tcp_user_timeout``
  (10,000 ms), set as libpq connection parameters;
- the MEM-12 locks of an operation (the advisory lock, then the
  conversation's row): the operation's lock wait plus :data:`ROW_LOCK_GRACE`,
  as ``SET LOCAL lock_timeout`` — after it an append goes ahead unserialized
  or, if the row itself stays locked, raises :class:`~flowmem.errors.StoreBusy`;
- each statement, on the server: ``statement_timeout`` (5 s), ``SET LOCAL``;
- the whole operation, on the client (a stopped or hung server answers
  nothing and trips none of the above): :meth:`PostgresOptions.budget`, kept
  by :mod:`flowmem.stores.postgres_watchdog`.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..errors import InvalidStoreURL, MissingDependency, StoreBusy, StoreError, StoreUnavailable
from ..scopes import StorageKey

try:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict
    from psycopg.pq import TransactionStatus
    from psycopg.pq import version as libpq_version
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency("psycopg", "postgres") from exc
try:
    from psycopg_pool import PoolClosed, PoolTimeout
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency("psycopg_pool", "postgres") from exc

from .sql import SQLConversations

__all__ = [
    "EDIT_LOCK_TIMEOUT",
    "LIBPQ_DEFAULTS",
    "MIGRATION_TIMEOUT",
    "ROW_LOCK_GRACE",
    "SAVEPOINT",
    "SQL",
    "WRITE_LOCK_TIMEOUT",
    "PostgresOptions",
    "advisory_key",
    "begin_statement",
    "broken",
    "connect_kwargs",
    "lock_fallback_statement",
    "mapped",
    "pg",
    "row_wait_statement",
]

OPTIONS: Final = ("schema", "pool_min", "pool_max", "pool_timeout", "statement_timeout")
WRITE_LOCK_TIMEOUT: Final = 5.0  # write/delete wait this long for the key's lock
EDIT_LOCK_TIMEOUT: Final = 30.0  # the administrative edit, as on SQLite
ROW_LOCK_GRACE: Final = 0.5
"""Seconds a writer may still wait for the conversation's row once its MEM-12
lock wait is spent (the lock came late, or the append runs unserialized)."""
MIGRATION_TIMEOUT: Final = 300.0  # opening: the first start's or an upgrade's DDL
ANSWER_MARGIN: Final = 1.0  # the client's deadline allows this much beyond the server's bounds
LIBPQ_DEFAULTS: Final = {
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
    "tcp_user_timeout": "10000",  # milliseconds (libpq >= 12)
}
"""libpq connection parameters flowmem sets when neither the URL nor the
environment (``PGCONNECT_TIMEOUT``) gives them."""
SAVEPOINT: Final = "flowmem_mem12"
SQL: Final = SQLConversations(lock_row=" FOR UPDATE")
_MAX_TIMEOUT_MS: Final = 2**31 - 1
_UNAVAILABLE_STATES: Final = ("57P01", "57P02", "57P03")  # shutdown, crash, cannot connect now
_BUSY_STATES: Final = ("55P03", "40P01", "40001")  # lock timeout, deadlock, serialization
_STATEMENT_TIMEOUT: Final = "57014"  # query_canceled: statement_timeout (or a cancel request)


@dataclass(frozen=True, slots=True)
class PostgresOptions:
    """A PostgreSQL store URL, parsed: libpq's part and flowmem's options."""

    conninfo: str
    schema: str = "flowmem"
    pool_min: int = 1
    pool_max: int = 10
    pool_timeout: float = 5.0
    statement_timeout: float = 5.0

    def __post_init__(self) -> None:
        if (not 0 <= self.pool_min <= self.pool_max or self.pool_max < 1
                or not self.pool_timeout > 0 or not self.statement_timeout >= 0
                or math.isinf(self.statement_timeout)):
            raise InvalidStoreURL(
                f"need 0 <= pool_min <= pool_max, pool_max >= 1, pool_timeout > 0 and a "
                f"finite statement_timeout >= 0; got {self.pool_min}, {self.pool_max}, "
                f"{self.pool_timeout}, {self.statement_timeout}")

    def budget(self, lock_wait: float | None) -> float:
        """The client's deadline, in seconds, for one operation's transaction (0: none).

        The MEM-12 lock waits (``lock_wait`` plus :data:`ROW_LOCK_GRACE`), one
        ``statement_timeout`` for the statements, and :data:`ANSWER_MARGIN`.
        ``statement_timeout=0`` turns the server's and the client's bound off.
        """
        if self.statement_timeout == 0:
            return 0.0
        locks = 0.0 if lock_wait is None else max(lock_wait, 0.0) + ROW_LOCK_GRACE
        return locks + self.statement_timeout + ANSWER_MARGIN

    @classmethod
    def from_url(cls, url: str) -> PostgresOptions:
        """``postgresql://user@host:port/db?schema=...&statement_timeout=...`` (the rest
        goes to libpq)."""
        parts = urlsplit(url)
        if parts.scheme.lower() not in ("postgresql", "postgres"):
            raise InvalidStoreURL(f"not a PostgreSQL URL: {url!r}")
        query = parse_qsl(parts.query, keep_blank_values=True)
        ours = {name: value for name, value in query if name in OPTIONS}
        libpq = [(name, value) for name, value in query if name not in OPTIONS]
        conninfo = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(libpq), ""))
        try:
            return cls(conninfo, schema=ours.get("schema", "flowmem"),
                       pool_min=int(ours.get("pool_min", 1)),
                       pool_max=int(ours.get("pool_max", 10)),
                       pool_timeout=float(ours.get("pool_timeout", 5.0)),
                       statement_timeout=float(ours.get("statement_timeout", 5.0)))
        except ValueError:
            raise InvalidStoreURL(f"pool_min/pool_max must be integers, pool_timeout and "
                                  f"statement_timeout seconds, in {url!r}") from None


def connect_kwargs(conninfo: str) -> dict[str, Any]:
    """psycopg connection arguments: autocommit (flowmem says BEGIN), nothing prepared
    (pgbouncer transaction pooling), and :data:`LIBPQ_DEFAULTS` the URL does not set."""
    kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": None}
    try:
        given = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as exc:
        raise InvalidStoreURL(f"unusable PostgreSQL URL: {exc}") from exc
    for name, value in LIBPQ_DEFAULTS.items():
        if name in given or (name == "connect_timeout" and "PGCONNECT_TIMEOUT" in os.environ):
            continue
        if name == "tcp_user_timeout" and libpq_version() < 120000:
            continue
        kwargs[name] = value
    return kwargs


def advisory_key(schema: str, key: StorageKey) -> int:
    """The MEM-12 advisory lock id of ``key``: a stable signed 64-bit hash."""
    raw = "\x00".join((schema, key.scope, key.scope_id, key.key))
    digest = hashlib.blake2b(raw.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


@lru_cache(maxsize=1024)
def pg(statement: str) -> str:
    """A ``?`` statement of :mod:`flowmem.stores.sql` in psycopg's ``%s`` style."""
    return statement.replace("%", "%%").replace("?", "%s")


def _timeout_ms(seconds: float) -> int:
    return min(max(1, math.ceil(seconds * 1000)), _MAX_TIMEOUT_MS)


def _statement_ms(seconds: float) -> int:
    return 0 if seconds == 0 else _timeout_ms(seconds)


def begin_statement(schema_ident: str, read_only: bool, lock: tuple[int, float] | None,
                    statement_timeout: float) -> str:
    """The first round trip: BEGIN, the search path, the statement timeout and, for a
    writer, the MEM-12 lock.

    With a lock and a positive timeout the lock is taken under ``lock_timeout``
    after a savepoint, and ``lock_timeout`` stays for the conversation's row
    (shortened by :func:`row_wait_statement` when the lock came late). On
    :class:`psycopg.errors.LockNotAvailable` the caller runs
    :func:`lock_fallback_statement` and goes ahead unserialized. With a
    timeout ≤ 0 the statement tries the lock once and returns whether it was
    had. The statement timeout is set after the lock wait, which
    ``lock_timeout`` bounds (else it would cut a long MEM-12 wait short).
    """
    if lock is None:
        return _begin_parts(schema_ident, read_only, None, statement_timeout)[0]
    head, tail = _begin_parts(schema_ident, read_only, lock[1], statement_timeout)
    return f"{head}'{lock[0]}'::bigint{tail}"


@lru_cache(maxsize=256)
def _begin_parts(schema_ident: str, read_only: bool, timeout: float | None,
                 statement_timeout: float) -> tuple[str, str]:
    """:func:`begin_statement` around the lock id (the rest is the same for every key)."""
    mode = "REPEATABLE READ READ ONLY" if read_only else "READ COMMITTED"
    head = f"BEGIN ISOLATION LEVEL {mode}; SET LOCAL search_path TO {schema_ident}"
    statement = f"SET LOCAL statement_timeout = {_statement_ms(statement_timeout)}"
    if timeout is None:
        return f"{head}; {statement}", ""
    grace = _timeout_ms(ROW_LOCK_GRACE)
    if timeout <= 0:
        return (f"{head}; {statement}; SET LOCAL lock_timeout = {grace}; "
                f"SELECT pg_try_advisory_xact_lock(", ")")
    return (f"{head}; SET LOCAL lock_timeout = {_timeout_ms(timeout)}; SAVEPOINT {SAVEPOINT}; "
            f"SELECT pg_advisory_xact_lock(",
            f"), set_config('statement_timeout', '{_statement_ms(statement_timeout)}', true)")


def row_wait_statement(timeout: float, waited: float) -> str | None:
    """After the MEM-12 lock was had in ``waited`` seconds: the statement that leaves the
    row what is left of ``timeout`` (at least :data:`ROW_LOCK_GRACE`), or ``None`` when
    the lock came within the grace (the row keeps ``timeout``). Either way the two
    waits together stay within ``timeout`` + :data:`ROW_LOCK_GRACE`."""
    if waited <= ROW_LOCK_GRACE:
        return None
    return f"SET LOCAL lock_timeout = {_timeout_ms(max(ROW_LOCK_GRACE, timeout - waited))}"


def lock_fallback_statement(statement_timeout: float) -> str:
    """After the lock wait timed out: back to the savepoint, then on unserialized
    (MEM-12), still waiting at most :data:`ROW_LOCK_GRACE` for the conversation's row."""
    return (f"ROLLBACK TO SAVEPOINT {SAVEPOINT}; "
            f"SET LOCAL lock_timeout = {_timeout_ms(ROW_LOCK_GRACE)}; "
            f"SET LOCAL statement_timeout = {_statement_ms(statement_timeout)}")


def broken(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether a connection can no longer be trusted (closed, or its state unknown)."""
    return conn.closed or conn.info.transaction_status == TransactionStatus.UNKNOWN


def mapped(exc: BaseException, *, lost: bool = False, committing: bool = False,
           timed_out: float | None = None) -> StoreError:
    """psycopg's and the pool's errors as flowmem's (never a driver exception outside).

    ``timed_out``: the client's deadline (that many seconds) cut the connection.
    """
    if isinstance(exc, PoolClosed):
        return StoreError("the PostgreSQL store is closed")
    if isinstance(exc, PoolTimeout):
        return StoreUnavailable(f"no PostgreSQL connection within pool_timeout (server "
                                f"unreachable or pool exhausted): {exc}")
    outcome = ("the operation may or may not have been stored" if committing
               else "nothing was stored")
    if timed_out is not None:
        return StoreUnavailable(f"PostgreSQL did not answer within {timed_out:.1f}s (server "
                                f"stopped, hung or unreachable); the connection was closed "
                                f"and {outcome}")
    state = getattr(exc, "sqlstate", None) or ""
    if state == _STATEMENT_TIMEOUT:
        return StoreUnavailable(f"PostgreSQL statement ran past statement_timeout (server "
                                f"overloaded or stalled); {outcome}: {exc}")
    if (lost or state.startswith("08") or state in _UNAVAILABLE_STATES
            or (isinstance(exc, psycopg.OperationalError) and not state)):
        if committing:
            return StoreUnavailable(f"PostgreSQL connection lost during COMMIT; the "
                                    f"operation may or may not have been stored: {exc}")
        return StoreUnavailable(f"PostgreSQL connection lost; nothing was stored: {exc}")
    if state in _BUSY_STATES:
        return StoreBusy(f"PostgreSQL lock wait failed ({state}): {exc}")
    return StoreError(f"PostgreSQL error ({state or 'client'}): {exc}")
