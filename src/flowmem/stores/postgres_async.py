"""``postgresql://…`` for :class:`~flowmem.AsyncMemory`: psycopg's asyncio pool.

The asyncio twin of :mod:`flowmem.stores.postgres`: the same URL, the same
round trips (the first carries BEGIN, the search path, the timeouts and the
MEM-12 advisory lock with the program's first step; a final batch carries
COMMIT: two for the common append), the same SQL programs
(:mod:`flowmem.stores.sql`), the same error mapping — only awaited. The
schema is migrated when the store opens, on first use (``from_url`` needs
no running loop).

The same bounds, too (listed in :mod:`flowmem.stores.postgres`): the
client's deadline is kept by the same watchdog thread, which shuts the
connection's socket down — the event loop's reader sees end-of-file at once;
no ``asyncio`` timeout is used, because cancelling psycopg mid-query makes
it send a cancel request and wait again, which a frozen server never answers.

Cancellation: a task cancelled inside a transaction rolls it back (or, if
the connection is left mid-statement, the pool discards the connection and
the server rolls back), so an operation is applied whole or not at all;
the advisory lock is transaction-level and goes with the transaction. A
cancellation that lands while ``COMMIT`` is in flight leaves the outcome
to the server: whole or nothing, never part. The rollback after a
cancellation still runs under the operation's deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from dataclasses import replace
from typing import Any

from ..errors import MissingDependency, StoreError

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg.generators import execute
    from psycopg_pool import AsyncConnectionPool
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency(exc.name or "psycopg", "postgres") from exc

from ..messages import Message
from ..scopes import StorageKey
from ..store import AppendOutcome, HistoryPage, Idempotency
from .postgres import setup
from .postgres_common import (
    COMMIT,
    EDIT_LOCK_TIMEOUT,
    PROBE,
    SQL,
    WRITE_LOCK_TIMEOUT,
    Begin,
    PostgresOptions,
    TransactionState,
    broken,
    connect_kwargs,
    mapped,
    unserialized,
)
from .postgres_prepared import Replay, RoundTrip, Statements, Switch
from .postgres_schema import quoted_schema
from .postgres_watchdog import Deadline, arm, disarm
from .sql_program import Batch, Program, Rows, Statement, T, adrive, encode

__all__ = ["AsyncPostgresStore"]

Row = tuple[Any, ...]


class Connection(psycopg.AsyncConnection[Row]):
    """A pooled connection and its prepared statements: they live and die together."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.statements = Statements()


async def _send(conn: Connection, switch: Switch, statements: Sequence[Statement],
                head: Begin | None = None) -> list[Rows]:
    """As the blocking face's ``_send`` (:mod:`.postgres`), the answer awaited."""
    trip = RoundTrip(conn, switch, statements, head)
    try:
        async with conn.lock:
            conn.pgconn.send_query(trip.sql)
            results = await conn.wait(execute(conn.pgconn))
    except BaseException:  # a cancellation too: what ran is not known
        trip.lost()
        raise
    return trip.rows(results)


class AsyncPostgresStore:
    """The PostgreSQL backend for asyncio (see the module notes)."""

    def __init__(self, options: PostgresOptions) -> None:
        self.schema = options.schema
        self._options = options
        self._ident = quoted_schema(options.schema)
        self._switch = Switch(options.prepared)
        self._pool: AsyncConnectionPool[Connection] | None = None
        self._opening = asyncio.Lock()
        self._closed = False

    @classmethod
    def from_url(cls, url: str) -> AsyncPostgresStore:
        """``postgresql://user@host:port/db?schema=...&pool_max=...`` (as the blocking store)."""
        return cls(PostgresOptions.from_url(url))

    async def _opened(self) -> AsyncConnectionPool[Connection]:
        if self._pool is not None:
            return self._pool
        async with self._opening:
            if self._closed:
                raise StoreError("the PostgreSQL store is closed")
            if self._pool is None:
                options = self._options
                await asyncio.to_thread(setup, options)  # once: connect and migrate
                pool: AsyncConnectionPool[Connection] = AsyncConnectionPool(
                    options.conninfo, connection_class=Connection,
                    kwargs=connect_kwargs(options.conninfo),
                    min_size=options.pool_min, max_size=options.pool_max,
                    timeout=options.pool_timeout, open=False, name=f"flowmem-{self.schema}")
                await pool.open()
                self._pool = pool
        return self._pool

    # -- transactions ---------------------------------------------------------------
    async def _connect(self, tx: _Transaction, statements: Sequence[Statement]) -> list[Rows]:
        """A pooled connection for ``tx``, its deadline armed, and the first round trip (a
        pooled connection found dead on it is replaced, as on the blocking face)."""
        pool = await self._opened()
        for attempt in range(self._options.pool_max + 1):
            try:
                conn = await pool.getconn()
            except psycopg.Error as exc:
                raise mapped(exc) from exc
            deadline: Deadline | None = None
            try:
                deadline = arm(conn, tx.budget)
                rows = await tx.first(conn, statements)
            except BaseException as exc:
                lost = broken(conn)
                timed_out = await self._give_back(conn, deadline, failed=True)
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

    async def _give_back(self, conn: Connection, deadline: Deadline | None, *,
                         failed: bool) -> float | None:
        """Return ``conn`` to the pool (after a failure rolled back, or closed when unsure);
        the seconds of its deadline if that cut it, else ``None``.

        The rollback runs under the deadline, so a cancellation on a frozen server
        (psycopg then sends a cancel request and waits) still ends by it.
        """
        usable = not (failed and broken(conn))
        try:
            if failed and usable:
                usable = False
                await conn.execute("ROLLBACK")
                usable = True
        except psycopg.Error:
            pass
        finally:
            disarm(deadline)
            if not usable:
                await conn.close()  # mid-statement or lost: the server rolls back and unlocks
            if self._pool is not None:
                with suppress(psycopg.Error):
                    await self._pool.putconn(conn)
        return deadline.seconds if deadline is not None and deadline.fired else None

    @asynccontextmanager
    async def _transaction(self, *, read_only: bool = False,
                           lock: tuple[StorageKey, float] | None = None,
                           ) -> AsyncIterator[_Transaction]:
        """One transaction under the operation's deadline, committed when the block ends
        (unless a final batch carried the ``COMMIT``)."""
        tx = _Transaction(self, read_only, lock)
        try:
            yield tx
            await tx.commit()
        except BaseException as exc:
            if tx.conn is None:  # never opened, or already given back by _connect
                raise
            lost = broken(tx.conn)
            timed_out = await self._give_back(tx.conn, tx.deadline, failed=True)
            if isinstance(exc, psycopg.Error):
                raise mapped(exc, lost=lost, committing=tx.committing and lost,
                             timed_out=timed_out) from exc
            raise
        assert tx.conn is not None
        await self._give_back(tx.conn, tx.deadline, failed=False)

    async def _run(self, program: Callable[[], Program[T]], *, read_only: bool = False,
                   lock: tuple[StorageKey, float] | None = None) -> tuple[T, bool]:
        """Run the program ``program()`` makes in one transaction; its value and whether
        it was serialized — once more after a
        :class:`~flowmem.stores.postgres_prepared.Replay` (as the blocking store)."""
        try:
            return await self._once(program, read_only, lock)
        except Replay:
            return await self._once(program, read_only, lock)

    async def _once(self, program: Callable[[], Program[T]], read_only: bool,
                    lock: tuple[StorageKey, float] | None) -> tuple[T, bool]:
        async with self._transaction(read_only=read_only, lock=lock) as tx:
            value = await adrive(program(), tx.execute, tx.batch)
        return value, tx.serialized

    # -- the AsyncStore protocol ---------------------------------------------------------
    async def read(self, key: StorageKey) -> tuple[bool, Any]:
        return (await self._run(lambda: SQL.read(key), read_only=True))[0]

    async def write(self, key: StorageKey, value: Any, *,
                    idempotency: Idempotency | None = None) -> None:
        body = encode(value)
        await self._run(lambda: SQL.write(key, body, idempotency),
                        lock=(key, WRITE_LOCK_TIMEOUT))

    async def delete(self, key: StorageKey, *, idempotency: Idempotency | None = None) -> bool:
        return (await self._run(lambda: SQL.delete(key, idempotency),
                                lock=(key, WRITE_LOCK_TIMEOUT)))[0]

    async def append(self, key: StorageKey, incoming: Sequence[Message], *,
                     max_messages: int | None, lock_timeout: float,
                     idempotency: Idempotency | None = None, tail: int = 0) -> AppendOutcome:
        # MEM-12: whether the lock was had is known once the first step ran
        outcome, serialized = await self._run(
            lambda: SQL.append(key, incoming, max_messages, True, idempotency, tail),
            lock=(key, lock_timeout))
        return outcome if serialized else replace(outcome, serialized=False)

    async def history(self, key: StorageKey, *, last: int | None = None,
                      before: int | None = None) -> HistoryPage:
        return (await self._run(lambda: SQL.history(key, last, before), read_only=True))[0]

    async def edit(self, key: StorageKey, position: int, message: Message | None) -> bool:
        return (await self._run(lambda: SQL.edit(key, position, message),
                                lock=(key, EDIT_LOCK_TIMEOUT)))[0]

    async def keys(self, scope: str, scope_id: str, *, prefix: str = "",
                   after: str | None = None, limit: int = 100) -> list[str]:
        return (await self._run(lambda: SQL.keys(scope, scope_id, prefix, after, limit),
                                read_only=True))[0]

    def lock(self, key: StorageKey, timeout: float) -> AbstractAsyncContextManager[bool]:
        """Hold ``key``'s advisory lock in a transaction of its own while the block runs."""
        return self._hold(key, timeout)

    @asynccontextmanager
    async def _hold(self, key: StorageKey, timeout: float) -> AsyncIterator[bool]:
        async with self._transaction(lock=(key, timeout)) as tx:
            await tx.batch(Batch(()))
            disarm(tx.deadline)  # the caller's block is not bounded by the deadline
            tx.deadline = None
            try:
                yield tx.serialized
            finally:
                with suppress(psycopg.Error):  # a lost connection fails at COMMIT
                    tx.deadline = arm(tx.conn, self._options.budget(None))

    async def aclose(self) -> None:
        async with self._opening:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()


class _Transaction(TransactionState):
    """One transaction of an :class:`AsyncPostgresStore`, opened by its first round trip
    (``BEGIN``, the settings and the MEM-12 lock with the program's first step); a final
    batch carries the ``COMMIT`` (as the blocking store's)."""

    def __init__(self, store: AsyncPostgresStore, read_only: bool,
                 lock: tuple[StorageKey, float] | None) -> None:
        super().__init__(store._options, store._ident, store.schema, read_only, lock)
        self.store = store
        self.conn: Connection | None = None

    async def execute(self, sql: str, params: Sequence[Any]) -> Rows:
        return (await self.batch(Batch(((sql, params),))))[0]

    async def batch(self, batch: Batch) -> list[Rows]:
        statements = (*batch.statements, COMMIT) if batch.final else batch.statements
        self.committing = batch.final
        if self.conn is None:
            rows = await self.store._connect(self, statements)
        else:
            rows = await _send(self.conn, self.store._switch, statements)
        self.committed = batch.final
        return rows[:len(batch.statements)]

    async def first(self, conn: Connection, statements: Sequence[Statement]) -> list[Rows]:
        """The first round trip on ``conn``: :attr:`begin`, then ``statements``."""
        opening, switch = self.begin, self.store._switch
        try:
            rows = await _send(conn, switch, statements, opening)
        except pg_errors.LockNotAvailable:
            if not opening.waits:
                raise
            try:
                await _send(conn, switch, (PROBE,))
            except pg_errors.InvalidSavepointSpecification:  # the MEM-12 wait timed out
                self.serialized = False
                opening = unserialized(self.store._ident, self.store._options.statement_timeout)
                return (await _send(conn, switch, statements, opening))[opening.count:]
            raise  # the lock was had, the row stayed locked: StoreBusy
        if opening.tries:  # MEM-12: tried once; its row says whether it was had
            self.serialized = bool(rows[opening.count - 1][0][0])
        return rows[opening.count:]

    async def commit(self) -> None:
        if not self.committed:
            await self.batch(Batch((), final=True))
