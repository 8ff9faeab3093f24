"""``postgresql://user@host:port/db`` — the store for many workers on many machines.

One row per message (see :mod:`flowmem.stores.sql`, whose statements this
store runs unchanged); an append is one ``READ COMMITTED`` transaction of
indexed statements, in two round trips (below). Tables live in a dedicated
schema, created and upgraded by :func:`flowmem.stores.postgres_schema.migrate`
when the store opens.

URL options (``schema``, ``pool_min``/``pool_max``, ``pool_timeout``,
``statement_timeout``, ``prepared``; the rest of the query string goes to
libpq), the libpq defaults flowmem sets, and the bound of every wait (each
ends in a typed error) are tabled in ``docs/deploy.md``; the client's
deadline is :mod:`flowmem.stores.postgres_watchdog`'s.

Round trips: every step of a program (a statement, or a
:class:`~flowmem.stores.sql_program.Batch`) is ONE query string, its values
bound on the client, as psycopg's ``ClientCursor`` binds them
(:mod:`flowmem.stores.postgres_binding`; as psycopg2 always did: a failed
statement in the server's log, or ``pg_stat_activity``, shows them), and sent
in the simple protocol (psycopg's pipeline mode costs more client CPU than
it saves). With ``prepared=true`` a statement the connection has sent before
goes as ``EXECUTE`` of a statement prepared on that connection, the values
bound the same way (:mod:`flowmem.stores.postgres_prepared`): PostgreSQL
parses and plans it once per connection instead of on every turn.
The first step also carries ``BEGIN``, the search path, the timeouts and, for
a writer, the MEM-12 lock; a final batch also carries ``COMMIT``. So the
common append — an existing conversation, no window — is two round trips:
the lock, the conversation's row ``FOR UPDATE`` and the planner's view; then
the whole plan, the row's update and ``COMMIT``
(:mod:`flowmem.stores.sql_apply`). A new conversation takes one more,
healing one more per healed turn (MEM-3), a window that evicts one more.

Transaction pooling (pgbouncer ``pool_mode = transaction``) works with
``prepared=false``: no statement is prepared (psycopg's
``prepare_threshold=None`` too) and no session state is set — the search
path and the timeouts are ``SET LOCAL``, the MEM-12 lock is
transaction-level. Left on there, the first statement that meets a server
session without it turns prepared statements off for the store (one
warning) and its transaction runs again, unprepared
(:class:`~flowmem.stores.postgres_prepared.Replay`).

MEM-12: an append takes ``pg_advisory_xact_lock`` on a 64-bit hash of
(schema, scope, scope id, key) under a ``lock_timeout`` of its bounded wait,
then a savepoint that marks the lock had (:func:`~.postgres_common.begin`).
When the wait times out (the savepoint is not there), the transaction starts
over without the lock and the append goes ahead unserialized
(``serialized=False``), still atomic: the conversation's row is read ``FOR
UPDATE`` and the (buffer, result id) unique key makes a doubled result
impossible. The row wait is bounded too (what is left of ``lock_timeout``, at
least 0.5 s); a row held past it (by a transaction outside flowmem) is
``StoreBusy``. The lock ends with the transaction, or the client.

Failures: connection loss (or the server going away) raises
:class:`~flowmem.errors.StoreUnavailable`, any other server error
:class:`~flowmem.errors.StoreError`; the transaction is rolled back, so the
buffer is as it was. If the connection is lost while ``COMMIT`` is in flight
— during an append's last round trip, which carries it — the outcome is
unknown to the client and the error says so. A pooled connection found dead
on the first round trip (nothing committed) is replaced by another (at most
``pool_max`` times) before giving up; one cut by the client's deadline is not
retried.

The asyncio twin is :mod:`flowmem.stores.postgres_async`; both run the same
SQL programs (:mod:`flowmem.stores.sql`) and the same first round trip
(:mod:`flowmem.stores.postgres_common`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import replace
from typing import Any

from ..errors import InvalidStoreURL, MissingDependency, StoreError, StoreUnavailable

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg.generators import execute
    from psycopg_pool import ConnectionPool
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency(exc.name or "psycopg", "postgres") from exc

from ..messages import Message
from ..scopes import StorageKey
from ..store import AppendOutcome, HistoryPage, Idempotency
from .postgres_common import (
    COMMIT,
    EDIT_LOCK_TIMEOUT,
    MIGRATION_TIMEOUT,
    PROBE,
    SQL,
    WRITE_LOCK_TIMEOUT,
    Begin,
    PostgresOptions,
    TransactionState,
    advisory_key,
    broken,
    connect_kwargs,
    mapped,
    unserialized,
)
from .postgres_prepared import Replay, RoundTrip, Statements, Switch
from .postgres_schema import MIGRATIONS, migrate, quoted_schema, stored_version
from .postgres_watchdog import Deadline, arm, disarm
from .sql_program import Batch, Program, Rows, Statement, T, drive, encode

__all__ = ["PostgresStore", "advisory_key", "setup"]

Row = tuple[Any, ...]


class Connection(psycopg.Connection[Row]):
    """A pooled connection and its prepared statements: they live and die together."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.statements = Statements()


def _send(conn: Connection, switch: Switch, statements: Sequence[Statement],
          head: Begin | None = None) -> list[Rows]:
    """Run ``head`` and ``statements`` in one round trip (prepared where ``switch`` and
    the connection's cache say so); the rows of each.

    Sent on the connection's own protocol handle, not through a cursor: a cursor's
    per-result bookkeeping (descriptions, row makers, the prepared-statement cache)
    cost more client CPU than the round trip's I/O.
    """
    trip = RoundTrip(conn, switch, statements, head)
    try:
        with conn.lock:
            conn.pgconn.send_query(trip.sql)
            results = conn.wait(execute(conn.pgconn))
    except BaseException:
        trip.lost()
        raise
    return trip.rows(results)


def setup(options: PostgresOptions) -> None:
    """Connect once (failing fast when unreachable) and run the migrations."""
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
        if stored_version(cur, options.schema) < len(MIGRATIONS):
            disarm(deadline)  # first start or upgrade: DDL under the migration lock
            deadline = None
            deadline = arm(conn, MIGRATION_TIMEOUT if options.budget(None) else 0)
        migrate(cur, options.schema)
    except psycopg.Error as exc:
        lost, cut, deadline = broken(conn), deadline, None
        disarm(cut)
        timed_out = cut.seconds if cut is not None and cut.fired else None
        raise mapped(exc, lost=lost, timed_out=timed_out) from exc
    finally:
        disarm(deadline)
        conn.close()


class PostgresStore:
    """The PostgreSQL backend (see the module notes for pooling and locking)."""

    def __init__(self, conninfo: str, *, schema: str = "flowmem", pool_min: int = 1,
                 pool_max: int = 10, pool_timeout: float = 5.0,
                 statement_timeout: float = 5.0, prepared: bool = True) -> None:
        self._init(PostgresOptions(conninfo, schema, pool_min, pool_max, pool_timeout,
                                   statement_timeout, prepared))

    def _init(self, options: PostgresOptions) -> None:
        self.schema = options.schema
        self._options = options
        self._ident = quoted_schema(options.schema)
        self._switch = Switch(options.prepared)
        setup(options)
        self._pool: ConnectionPool[Connection] = ConnectionPool(
            options.conninfo, connection_class=Connection,
            kwargs=connect_kwargs(options.conninfo),
            min_size=options.pool_min, max_size=options.pool_max,
            timeout=options.pool_timeout, open=True, name=f"flowmem-{options.schema}")

    @classmethod
    def from_url(cls, url: str) -> PostgresStore:
        """``postgresql://user@host:port/db?schema=...&pool_max=...`` (see the module notes)."""
        store = cls.__new__(cls)
        store._init(PostgresOptions.from_url(url))
        return store

    # -- transactions ---------------------------------------------------------------
    def _connect(self, tx: _Transaction, statements: Sequence[Statement]) -> list[Rows]:
        """A pooled connection for ``tx``, its deadline armed, and the first round trip.

        A pooled connection found dead on the first round trip (a restart, a
        proxy closing idle connections: nothing was done) is replaced, at most
        once per pooled connection; one the deadline cut is not, nor one that
        was sent a ``COMMIT``.
        """
        for attempt in range(self._options.pool_max + 1):
            try:
                conn = self._pool.getconn()
            except psycopg.Error as exc:
                raise mapped(exc) from exc
            deadline: Deadline | None = None
            try:
                deadline = arm(conn, tx.budget)
                rows = tx.first(conn, statements)
            except BaseException as exc:
                lost = broken(conn)
                timed_out = self._give_back(conn, deadline, failed=True)
                if (lost and timed_out is None and isinstance(exc, psycopg.Error)
                        and not tx.committing and attempt < self._options.pool_max):
                    continue
                if isinstance(exc, psycopg.Error):
                    raise mapped(exc, lost=lost, committing=tx.committing and lost,
                                 timed_out=timed_out) from exc
                raise
            tx.conn, tx.deadline = conn, deadline
            return rows
        raise AssertionError("unreachable")

    def _give_back(self, conn: Connection, deadline: Deadline | None, *,
                   failed: bool) -> float | None:
        """Return ``conn`` to the pool (after a failure rolled back, or closed when that
        fails); the seconds of its deadline if that cut it, else ``None``."""
        usable = not (failed and broken(conn))
        try:
            if failed and usable:
                usable = False
                conn.execute("ROLLBACK")
                usable = True
        except psycopg.Error:
            pass
        finally:
            disarm(deadline)
            if not usable:
                conn.close()  # state unknown or lost: the pool discards a closed connection
            with suppress(psycopg.Error):
                self._pool.putconn(conn)
        return deadline.seconds if deadline is not None and deadline.fired else None

    @contextmanager
    def _transaction(self, *, read_only: bool = False,
                     lock: tuple[StorageKey, float] | None = None) -> Iterator[_Transaction]:
        """One transaction under the operation's deadline, committed when the block ends
        (unless a final batch carried the ``COMMIT``)."""
        tx = _Transaction(self, read_only, lock)
        try:
            yield tx
            tx.commit()
        except BaseException as exc:
            if tx.conn is None:  # never opened, or already given back by _connect
                raise
            lost = broken(tx.conn)
            timed_out = self._give_back(tx.conn, tx.deadline, failed=True)
            if isinstance(exc, psycopg.Error):
                raise mapped(exc, lost=lost, committing=tx.committing and lost,
                             timed_out=timed_out) from exc
            raise
        assert tx.conn is not None
        self._give_back(tx.conn, tx.deadline, failed=False)

    def _run(self, program: Callable[[], Program[T]], *, read_only: bool = False,
             lock: tuple[StorageKey, float] | None = None) -> tuple[T, bool]:
        """Run the program ``program()`` makes in one transaction; its value and whether
        the transaction was serialized (MEM-12).

        Run once more — the only retry of a whole transaction — after a
        :class:`~flowmem.stores.postgres_prepared.Replay`: a statement the
        prepared-statement layer added failed, which aborted the transaction
        before its ``COMMIT`` (nothing of it is stored), and that layer now sends
        it unprepared.
        """
        try:
            return self._once(program, read_only, lock)
        except Replay:
            return self._once(program, read_only, lock)

    def _once(self, program: Callable[[], Program[T]], read_only: bool,
              lock: tuple[StorageKey, float] | None) -> tuple[T, bool]:
        with self._transaction(read_only=read_only, lock=lock) as tx:
            value = drive(program(), tx.execute, tx.batch)
        return value, tx.serialized

    # -- the Store protocol ------------------------------------------------------
    def read(self, key: StorageKey) -> tuple[bool, Any]:
        return self._run(lambda: SQL.read(key), read_only=True)[0]

    def write(self, key: StorageKey, value: Any, *,
              idempotency: Idempotency | None = None) -> None:
        body = encode(value)
        self._run(lambda: SQL.write(key, body, idempotency), lock=(key, WRITE_LOCK_TIMEOUT))

    def delete(self, key: StorageKey, *, idempotency: Idempotency | None = None) -> bool:
        return self._run(lambda: SQL.delete(key, idempotency),
                         lock=(key, WRITE_LOCK_TIMEOUT))[0]

    def append(self, key: StorageKey, incoming: Sequence[Message], *,
               max_messages: int | None, lock_timeout: float,
               idempotency: Idempotency | None = None, tail: int = 0) -> AppendOutcome:
        # MEM-12: whether the lock was had is known once the first step ran
        outcome, serialized = self._run(
            lambda: SQL.append(key, incoming, max_messages, True, idempotency, tail),
            lock=(key, lock_timeout))
        return outcome if serialized else replace(outcome, serialized=False)

    def history(self, key: StorageKey, *, last: int | None = None,
                before: int | None = None) -> HistoryPage:
        return self._run(lambda: SQL.history(key, last, before), read_only=True)[0]

    def edit(self, key: StorageKey, position: int, message: Message | None) -> bool:
        return self._run(lambda: SQL.edit(key, position, message),
                         lock=(key, EDIT_LOCK_TIMEOUT))[0]

    def keys(self, scope: str, scope_id: str, *, prefix: str = "",
             after: str | None = None, limit: int = 100) -> list[str]:
        return self._run(lambda: SQL.keys(scope, scope_id, prefix, after, limit),
                         read_only=True)[0]

    def lock(self, key: StorageKey, timeout: float) -> AbstractContextManager[bool]:
        """Hold ``key``'s advisory lock in a transaction of its own while the block runs."""
        return self._hold(key, timeout)

    @contextmanager
    def _hold(self, key: StorageKey, timeout: float) -> Iterator[bool]:
        with self._transaction(lock=(key, timeout)) as tx:
            tx.batch(Batch(()))
            disarm(tx.deadline)  # the caller's block is not bounded by the deadline
            tx.deadline = None
            try:
                yield tx.serialized
            finally:
                with suppress(psycopg.Error):  # a lost connection fails at COMMIT
                    tx.deadline = arm(tx.conn, self._options.budget(None))

    def close(self) -> None:
        self._pool.close()


class _Transaction(TransactionState):
    """One transaction of a :class:`PostgresStore`, opened by its first round trip.

    That round trip carries ``BEGIN``, the settings and the MEM-12 lock
    (:func:`~flowmem.stores.postgres_common.begin`) with the program's first
    step; a final :class:`~flowmem.stores.sql_program.Batch` carries the
    ``COMMIT``. Each step is one round trip.
    """

    def __init__(self, store: PostgresStore, read_only: bool,
                 lock: tuple[StorageKey, float] | None) -> None:
        super().__init__(store._options, store._ident, store.schema, read_only, lock)
        self.store = store
        self.conn: Connection | None = None

    def execute(self, sql: str, params: Sequence[Any]) -> Rows:
        return self.batch(Batch(((sql, params),)))[0]

    def batch(self, batch: Batch) -> list[Rows]:
        statements = (*batch.statements, COMMIT) if batch.final else batch.statements
        self.committing = batch.final
        if self.conn is None:
            rows = self.store._connect(self, statements)
        else:
            rows = _send(self.conn, self.store._switch, statements)
        self.committed = batch.final
        return rows[:len(batch.statements)]

    def first(self, conn: Connection, statements: Sequence[Statement]) -> list[Rows]:
        """The first round trip on ``conn``: :attr:`begin`, then ``statements``."""
        opening, switch = self.begin, self.store._switch
        try:
            rows = _send(conn, switch, statements, opening)
        except pg_errors.LockNotAvailable:
            if not opening.waits:
                raise
            try:
                _send(conn, switch, (PROBE,))
            except pg_errors.InvalidSavepointSpecification:  # the MEM-12 wait timed out
                self.serialized = False
                opening = unserialized(self.store._ident, self.store._options.statement_timeout)
                return (_send(conn, switch, statements, opening))[opening.count:]
            raise  # the lock was had, the row stayed locked: StoreBusy
        if opening.tries:  # MEM-12: tried once; its row says whether it was had
            self.serialized = bool(rows[opening.count - 1][0][0])
        return rows[opening.count:]

    def commit(self) -> None:
        if not self.committed:
            self.batch(Batch((), final=True))
