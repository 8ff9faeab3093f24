"""What the blocking and the asyncio PostgreSQL stores share: the URL, the
bounds of every wait, the MEM-12 lock id, the statements that open a
transaction, how a step becomes one query string, and the error mapping.

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
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from ..errors import InvalidStoreURL, MissingDependency, StoreBusy, StoreError, StoreUnavailable
from ..scopes import StorageKey

try:
    import psycopg
    from psycopg import adapt
    from psycopg import errors as pg_errors
    from psycopg.conninfo import conninfo_to_dict
    from psycopg.pq import ExecStatus, TransactionStatus
    from psycopg.pq import version as libpq_version
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency("psycopg", "postgres") from exc
try:
    from psycopg_pool import PoolClosed, PoolTimeout
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency("psycopg_pool", "postgres") from exc

from .postgres_watchdog import Deadline
from .sql import SQLConversations
from .sql_program import Rows, Statement

__all__ = [
    "COMMIT",
    "EDIT_LOCK_TIMEOUT",
    "LIBPQ_DEFAULTS",
    "MIGRATION_TIMEOUT",
    "ROW_LOCK_GRACE",
    "SQL",
    "WRITE_LOCK_TIMEOUT",
    "Begin",
    "PostgresOptions",
    "TransactionState",
    "advisory_key",
    "begin",
    "broken",
    "connect_kwargs",
    "mapped",
    "pg",
    "query",
    "rows_of",
    "unserialized",
]

OPTIONS: Final = ("schema", "pool_min", "pool_max", "pool_timeout", "statement_timeout",
                  "prepared")
_BOOLEANS: Final = {"true": True, "1": True, "yes": True, "on": True,
                    "false": False, "0": False, "no": False, "off": False}
WRITE_LOCK_TIMEOUT: Final = 5.0  # write/delete wait this long for the key's lock
EDIT_LOCK_TIMEOUT: Final = 30.0  # the administrative edit, as on SQLite
ROW_LOCK_GRACE: Final = 0.5
"""Seconds a writer may still wait for the conversation's row once its MEM-12
lock wait is spent (the lock came late, or the append runs unserialized)."""
MIGRATION_TIMEOUT: Final = 300.0  # opening: the first start's or an upgrade's DDL
SAVEPOINT: Final = "flowmem_mem12"
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
    prepared: bool = True
    """Send repeated statements as server-side prepared statements
    (:mod:`flowmem.stores.postgres_prepared`); ``false`` behind a transaction-pooling proxy."""

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
        """``postgresql://user@host:port/db?schema=...&statement_timeout=...&prepared=...``
        (the rest goes to libpq)."""
        parts = urlsplit(url)
        if parts.scheme.lower() not in ("postgresql", "postgres"):
            raise InvalidStoreURL(f"not a PostgreSQL URL: {url!r}")
        query = parse_qsl(parts.query, keep_blank_values=True)
        ours = {name: value for name, value in query if name in OPTIONS}
        libpq = [(name, value) for name, value in query if name not in OPTIONS]
        # %20, not +: libpq decodes a URI's percent escapes only (options=-c%20name%3Dvalue)
        conninfo = urlunsplit((parts.scheme, parts.netloc, parts.path,
                               urlencode(libpq, quote_via=quote), ""))
        prepared = _BOOLEANS.get(ours.get("prepared", "true").lower())
        if prepared is None:
            raise InvalidStoreURL(f"prepared must be true or false, in {url!r}")
        try:
            return cls(conninfo, schema=ours.get("schema", "flowmem"),
                       pool_min=int(ours.get("pool_min", 1)),
                       pool_max=int(ours.get("pool_max", 10)),
                       pool_timeout=float(ours.get("pool_timeout", 5.0)),
                       statement_timeout=float(ours.get("statement_timeout", 5.0)),
                       prepared=prepared)
        except ValueError:
            raise InvalidStoreURL(f"pool_min/pool_max must be integers, pool_timeout and "
                                  f"statement_timeout seconds, in {url!r}") from None


def connect_kwargs(conninfo: str) -> dict[str, Any]:
    """psycopg connection arguments: autocommit (flowmem says BEGIN), nothing prepared by
    psycopg (flowmem's own round trips prepare at the SQL level, if at all:
    :mod:`flowmem.stores.postgres_prepared`), and :data:`LIBPQ_DEFAULTS` the URL does not set."""
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
    names = (schema, key.scope, key.scope_id, key.key)
    known = _advisory_keys.get(names)  # hot keys: no blake2b per transaction
    if known is not None:
        return known
    raw = "\x00".join(names)
    digest = hashlib.blake2b(raw.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    if len(_advisory_keys) >= _ADVISORY_CACHE:
        _advisory_keys.clear()
    found = _advisory_keys[names] = int.from_bytes(digest, "big", signed=True)
    return found


_ADVISORY_CACHE: Final = 4096
_advisory_keys: dict[tuple[str, str, str, str], int] = {}


@lru_cache(maxsize=1024)
def pg(statement: str) -> str:
    """A ``?`` statement of :mod:`flowmem.stores.sql` in psycopg's ``%s`` style."""
    return statement.replace("%", "%%").replace("?", "%s")


def _timeout_ms(seconds: float) -> int:
    return min(max(1, math.ceil(seconds * 1000)), _MAX_TIMEOUT_MS)


def _statement_ms(seconds: float) -> int:
    return 0 if seconds == 0 else _timeout_ms(seconds)


COMMIT: Final[Statement] = ("COMMIT", ())


@dataclass(frozen=True, slots=True)
class Begin:
    """The statements that open a transaction (``sql``, ``count`` of them), sent in one
    round trip with the transaction's first step.

    ``tries``: the last one's row says whether the MEM-12 lock was had. ``waits``:
    the lock is waited for; a :class:`psycopg.errors.LockNotAvailable` is then
    either that wait timing out or the conversation's row staying locked —
    :data:`PROBE` tells which.
    """

    sql: str
    count: int
    tries: bool = False
    waits: bool = False


PROBE: Final[Statement] = (f"ROLLBACK TO SAVEPOINT {SAVEPOINT}", ())
"""After a lock-timeout error in a waiting :class:`Begin`: succeeds when the MEM-12 lock
was had (the savepoint right after it exists: the row stayed locked), fails with
:class:`psycopg.errors.InvalidSavepointSpecification` when the lock's wait timed out."""


def begin(schema_ident: str, read_only: bool, lock: tuple[int, float] | None,
          statement_timeout: float) -> Begin:
    """BEGIN, the search path, the statement timeout and, for a writer, the MEM-12 lock.

    With a positive timeout the lock is waited for under ``lock_timeout``, then a
    savepoint marks it had (:data:`PROBE`), the statement timeout is set (after
    the lock wait: it would cut a long MEM-12 wait short) and ``lock_timeout`` is
    left for the conversation's row — all of it when the lock came within
    :data:`ROW_LOCK_GRACE`, else what is left of it, at least the grace: worked
    out by the server from the time the lock took, so the two waits together stay
    within ``timeout`` + :data:`ROW_LOCK_GRACE` with no round trip in between.
    When the lock's wait times out the caller starts over with
    :func:`unserialized`. With a timeout ≤ 0 the lock is tried once.
    """
    if lock is None:
        return _plain(schema_ident, read_only, statement_timeout)
    key, timeout = lock
    parts, count = _locking(schema_ident, timeout, statement_timeout)
    return Begin(f"'{key}'::bigint".join(parts), count, tries=timeout <= 0, waits=timeout > 0)


class TransactionState:
    """What one transaction of either face knows before it runs: how it opens
    (:attr:`begin`: ``BEGIN``, the settings and the MEM-12 lock), its deadline's
    budget, and how far it got (whether the lock was had, whether ``COMMIT`` was sent)."""

    def __init__(self, options: PostgresOptions, schema_ident: str, schema: str,
                 read_only: bool, lock: tuple[StorageKey, float] | None) -> None:
        held = None if lock is None else (advisory_key(schema, lock[0]), lock[1])
        self.begin = begin(schema_ident, read_only, held, options.statement_timeout)
        self.budget = options.budget(None if lock is None else lock[1])
        self.deadline: Deadline | None = None
        self.serialized = True
        self.committing = False
        self.committed = False


def _settings(schema_ident: str, read_only: bool) -> list[str]:
    mode = "REPEATABLE READ READ ONLY" if read_only else "READ COMMITTED"
    return [f"BEGIN ISOLATION LEVEL {mode}", f"SET LOCAL search_path TO {schema_ident}"]


@lru_cache(maxsize=64)
def _plain(schema_ident: str, read_only: bool, statement_timeout: float) -> Begin:
    statements = [*_settings(schema_ident, read_only),
                  f"SET LOCAL statement_timeout = {_statement_ms(statement_timeout)}"]
    return Begin("; ".join(statements), len(statements))


@lru_cache(maxsize=64)
def unserialized(schema_ident: str, statement_timeout: float) -> Begin:
    """After the MEM-12 lock's wait timed out: the transaction over again, unserialized
    (MEM-12), waiting at most :data:`ROW_LOCK_GRACE` for the conversation's row."""
    statements = ["ROLLBACK", *_settings(schema_ident, False),
                  f"SET LOCAL statement_timeout = {_statement_ms(statement_timeout)}",
                  f"SET LOCAL lock_timeout = {_timeout_ms(ROW_LOCK_GRACE)}"]
    return Begin("; ".join(statements), len(statements))


@lru_cache(maxsize=256)
def _locking(schema_ident: str, timeout: float,
             statement_timeout: float) -> tuple[tuple[str, ...], int]:
    """:func:`begin`'s statements for a writer, split where the lock id goes."""
    grace = _timeout_ms(ROW_LOCK_GRACE)
    statement = f"SET LOCAL statement_timeout = {_statement_ms(statement_timeout)}"
    statements = _settings(schema_ident, False)
    if timeout <= 0:
        statements += [statement, f"SET LOCAL lock_timeout = {grace}",
                       "SELECT pg_try_advisory_xact_lock({key})"]
    else:
        full = _timeout_ms(timeout)
        statements += [
            f"SET LOCAL lock_timeout = {full}",
            "SELECT pg_advisory_xact_lock({key})",
            f"SAVEPOINT {SAVEPOINT}",
            statement,
            f"SELECT set_config('lock_timeout', (CASE WHEN waited <= {grace} THEN {full} "
            f"ELSE greatest({grace}, {full} - waited) END)::text, true) "
            "FROM (SELECT (extract(epoch FROM clock_timestamp() - now()) * 1000)::bigint "
            "AS waited) AS lock_wait"]
    return tuple("; ".join(statements).split("{key}")), len(statements)


def query(statements: Sequence[Statement], head: Begin | None = None) -> tuple[str, list[Any]]:
    """``head`` and ``statements`` as ONE query string (``%s`` placeholders, bound by the
    client) and its parameters: one round trip, whose result sets are the statements'
    in order. PostgreSQL runs them one after the other, each under its own
    ``statement_timeout`` and, in ``READ COMMITTED``, with its own snapshot, taken when
    it starts (so a statement after a row lock sees what its holder committed)."""
    sql = "; ".join([*([head.sql] if head is not None else []),
                     *(pg(statement) for statement, _ in statements)])
    return sql, [value for _, params in statements for value in params]


_TUPLES_OK: Final = ExecStatus.TUPLES_OK
_NO_ROWS: Final = (ExecStatus.COMMAND_OK, ExecStatus.EMPTY_QUERY)


def _transformer(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> Any:
    """The connection's own row loader, made once (as a cursor keeps one)."""
    loader = getattr(conn, "_flowmem_loader", None)
    if loader is None:
        loader = adapt.Transformer(conn)
        setattr(conn, "_flowmem_loader", loader)  # noqa: B010 - not a declared attribute
    return loader


def rows_of(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
            results: Sequence[Any]) -> list[Rows]:
    """The rows of each result of one round trip, as tuples; the first error as
    psycopg's exception (a cursor's checks, without its per-result bookkeeping)."""
    loader = _transformer(conn)
    rows: list[Rows] = []
    for result in results:
        status = result.status
        if status == _TUPLES_OK:
            loader.set_pgresult(result)
            rows.append(loader.load_rows(0, result.ntuples, tuple))
        elif status in _NO_ROWS:
            rows.append([])
        elif status == ExecStatus.FATAL_ERROR:
            raise pg_errors.error_from_result(result, encoding=conn.info.encoding)
        else:
            raise pg_errors.InternalError(f"unexpected result status: {status}")
    if not rows:
        raise pg_errors.InternalError("got no result from the query")
    return rows


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
