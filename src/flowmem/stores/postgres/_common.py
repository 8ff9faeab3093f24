"""What the blocking and the asyncio PostgreSQL stores share: the URL, the
bounds of every wait, the MEM-12 lock id, the statements that open a
transaction and how a step becomes one query string (the error mapping is
:mod:`flowmem.stores.postgres._errors`).

Only the I/O differs between the two faces, and it is written once:
:mod:`flowmem.stores.postgres._async` is the source, ``_sync.py`` is generated
from it by ``scripts/unasync.py`` (token substitution). What substitution
cannot turn from one face into the other lives here: :func:`setup` (the
first connection, blocking) and the pair :class:`AsyncFace`/:class:`Face`
(when and how each face sets up, and its lock). The SQL of every operation
is the programs of :mod:`flowmem.stores.sql._conversations`.

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
  by :mod:`flowmem.stores.postgres._deadline`.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

from ...errors import (
    InvalidStoreURL,
    MissingDependency,
    StoreError,
    StoreUnavailable,
)
from ...scopes import StorageKey, conversation_key

try:
    import psycopg
    from psycopg import adapt
    from psycopg import errors as pg_errors
    from psycopg.pq import ExecStatus
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency("psycopg", "postgres") from exc

from ..sql._program import Rows, Statement
from ._deadline import Deadline, arm, disarm
from ._errors import broken, mapped
from ._options import (
    LIBPQ_DEFAULTS,
    ROW_LOCK_GRACE,
    PostgresOptions,
    connect_kwargs,
)
from ._programs import PostgresConversations
from ._schema import current, migrate, stored_state

__all__ = [
    "COMMIT",
    "EDIT_LOCK_TIMEOUT",
    "LIBPQ_DEFAULTS",
    "MIGRATION_TIMEOUT",
    "ROW_LOCK_GRACE",
    "SQL",
    "WRITE_LOCK_TIMEOUT",
    "AsyncFace",
    "Begin",
    "Face",
    "PostgresOptions",
    "TransactionState",
    "advisory_key",
    "begin",
    "connect_kwargs",
    "pg",
    "query",
    "rows_of",
    "setup",
    "unserialized",
]

WRITE_LOCK_TIMEOUT: Final = 5.0  # write/delete wait this long for the key's lock
EDIT_LOCK_TIMEOUT: Final = 30.0  # the administrative edit, as on SQLite
MIGRATION_TIMEOUT: Final = 300.0  # opening: the first start's or an upgrade's DDL
SQL: Final = PostgresConversations()
_MAX_TIMEOUT_MS: Final = 2**31 - 1


def advisory_key(schema: str, key: StorageKey) -> int:
    """The MEM-12 advisory lock id of ``key`` in ``schema``: its conversation key, salted.

    Advisory locks are database-wide; the schema's salt keeps two schemas'
    conversations of the same name from waiting on each other.
    """
    return conversation_key(key) ^ _schema_salt(schema)


@lru_cache(maxsize=64)
def _schema_salt(schema: str) -> int:
    digest = hashlib.blake2b(schema.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


@lru_cache(maxsize=1024)
def pg(statement: str) -> str:
    """A ``?`` statement of :mod:`flowmem.stores.sql._conversations` in psycopg's ``%s`` style."""
    return statement.replace("%", "%%").replace("?", "%s")


def _timeout_ms(seconds: float) -> int:
    return min(max(1, math.ceil(seconds * 1000)), _MAX_TIMEOUT_MS)


def _statement_ms(seconds: float) -> int:
    return 0 if seconds == 0 else _timeout_ms(seconds)


COMMIT: Final[Statement] = ("COMMIT", ())


@dataclass(frozen=True, slots=True)
class Begin:
    """How a transaction opens: ``sql`` (``count`` statements without parameters, sent
    first), then the ``lock`` statements (with parameters: prepared as a program's are),
    all in one round trip with the transaction's first step.

    ``tries``: the row of the (one) ``lock`` statement says whether the MEM-12 lock was
    had. ``waits``: the lock is waited for; a
    :class:`psycopg.errors.LockNotAvailable` AT the ``lock`` statement is that wait
    timing out, one at a later statement the conversation's row staying locked.
    """

    sql: str
    count: int
    tries: bool = False
    waits: bool = False
    lock: tuple[Statement, ...] = ()


def begin(schema_ident: str, read_only: bool, lock: tuple[int, float] | None,
          statement_timeout: float) -> Begin:
    """BEGIN, the search path, the statement timeout and, for a writer, the MEM-12 lock.

    With a positive timeout the lock is waited for under ``lock_timeout``; the
    statement that waits for it then sets the statement timeout (after the lock
    wait: it would cut a long MEM-12 wait short; PostgreSQL arms it per statement)
    and leaves ``lock_timeout`` for the conversation's row — all of it when the
    lock came within :data:`ROW_LOCK_GRACE`, else what is left of it, at least the
    grace: worked out by the server from the time the lock took, so the two waits
    together stay within ``timeout`` + :data:`ROW_LOCK_GRACE` with no round trip in
    between. When the lock's wait times out the caller starts over with
    :func:`unserialized`. With a timeout ≤ 0 the lock is tried once.
    """
    if lock is None:
        return _plain(schema_ident, read_only, statement_timeout)
    key, timeout = lock
    sql, count, locking = _locking(schema_ident, timeout, statement_timeout)
    return Begin(sql, count, tries=timeout <= 0, waits=timeout > 0,
                 lock=((locking, (key,)),))


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
        self.read_only = read_only

    def changed_maybe(self, lost: bool) -> bool:
        """Whether a lost connection leaves this transaction's outcome unknown: its
        ``COMMIT`` was sent and it could change data (a read-only one changes nothing)."""
        return self.committing and lost and not self.read_only


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
def _locking(schema_ident: str, timeout: float, statement_timeout: float) -> tuple[str, int, str]:
    """:func:`begin`'s statements for a writer: the settings (and their count), then the
    statement taking the lock (its one parameter: the lock id).

    One statement takes the lock and sets what must follow it: the innermost
    subquery (``OFFSET 0``: never merged into the query around it) waits for the lock,
    and only then does the outer one read the clock and set the timeouts. Sent with
    parameters, it is prepared like a program's statement (parsed and planned once
    per connection). No savepoint: whether the wait timed out is told by WHICH
    statement failed (:attr:`Begin.waits`).
    """
    grace = _timeout_ms(ROW_LOCK_GRACE)
    statement = _statement_ms(statement_timeout)
    statements = _settings(schema_ident, False)
    if timeout <= 0:
        statements += [f"SET LOCAL statement_timeout = {statement}",
                       f"SET LOCAL lock_timeout = {grace}"]
        return "; ".join(statements), len(statements), "SELECT pg_try_advisory_xact_lock(?::bigint)"
    full = _timeout_ms(timeout)
    statements.append(f"SET LOCAL lock_timeout = {full}")
    locking = (f"SELECT set_config('statement_timeout', '{statement}', true), "
               f"set_config('lock_timeout', (CASE WHEN waited <= {grace} THEN {full} "
               f"ELSE greatest({grace}, {full} - waited) END)::text, true) "
               "FROM (SELECT (extract(epoch FROM clock_timestamp() - now()) * 1000)::bigint "
               "AS waited FROM (SELECT pg_advisory_xact_lock(?::bigint) OFFSET 0) AS held) "
               "AS lock_wait")
    return "; ".join(statements), len(statements), locking


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


def setup(options: PostgresOptions) -> None:
    """Connect once (failing fast when unreachable) and set the schema up."""
    try:
        conn = psycopg.connect(options.conninfo, **connect_kwargs(options.conninfo))
    except psycopg.ProgrammingError as exc:
        raise InvalidStoreURL(f"unusable PostgreSQL URL: {exc}") from exc
    except psycopg.Error as exc:
        raise StoreUnavailable(f"cannot connect to PostgreSQL: {exc}") from exc
    deadline: Deadline | None = None
    try:
        deadline = arm(conn, options.budget(None))
        encoding = conn.info.parameter_status("server_encoding")
        if encoding != "UTF8":
            raise StoreError(f"flowmem needs a UTF8 database; this one is {encoding!r}")
        cur = conn.cursor()
        standby = cur.execute("SELECT pg_is_in_recovery()").fetchone()
        if standby is not None and standby[0]:
            raise StoreError("this PostgreSQL server is a standby (in recovery): give the "
                             "primary as the store URL, and a standby as ?replica=... for reads")
        if not current(stored_state(cur, options.schema)):
            disarm(deadline)  # first start or upgrade: DDL under the migration lock
            deadline = None
            deadline = arm(conn, MIGRATION_TIMEOUT if options.budget(None) else 0)
        migrate(cur, options.schema, options.partitions)
    except psycopg.Error as exc:
        lost, cut, deadline = broken(conn), deadline, None
        disarm(cut)
        timed_out = cut.seconds if cut is not None and cut.fired else None
        raise mapped(exc, lost=lost, timed_out=timed_out) from exc
    finally:
        disarm(deadline)
        conn.close()


class AsyncFace:
    """What the asyncio face does where the blocking one differs (``scripts/unasync.py``
    turns ``AsyncFace`` into :class:`Face`): it sets up on first use, in a worker thread
    (``from_url`` needs no running loop), under an :class:`asyncio.Lock`."""

    lock = asyncio.Lock

    @staticmethod
    def set_up_now(options: PostgresOptions) -> bool:
        """Whether the store's constructor set the schema up: not on this face."""
        return False

    @staticmethod
    async def set_up(options: PostgresOptions) -> None:
        await asyncio.to_thread(setup, options)


class Face:
    """The blocking face's :class:`AsyncFace`: it connects and sets up when the store is
    made (failing fast), under a :class:`threading.Lock`."""

    lock = threading.Lock

    @staticmethod
    def set_up_now(options: PostgresOptions) -> bool:
        setup(options)
        return True

    @staticmethod
    def set_up(options: PostgresOptions) -> None:
        setup(options)
