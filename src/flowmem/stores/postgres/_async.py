"""One face of the PostgreSQL store: the I/O around the sans-I/O programs.

This file is the source of both faces: ``_sync.py`` (the blocking face) is
generated from it by ``scripts/unasync.py``, token by token (a coroutine
function becomes a function, nothing is awaited, a name loses its ``Async``
prefix, ...);
``scripts/unasync.py --check`` fails when the generated file is stale. What
the faces cannot share that way is in :mod:`flowmem.stores.postgres._common`
(:class:`~flowmem.stores.postgres._common.AsyncFace`). The round trips,
the bounds of every wait, MEM-12, failures and cancellation are described in
:mod:`flowmem.stores.postgres`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from dataclasses import replace
from functools import partial
from typing import Any

from ...errors import MissingDependency, StoreError

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg.generators import execute
    from psycopg_pool import AsyncConnectionPool
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency(exc.name or "psycopg", "postgres") from exc

from ...messages import Message
from ...retention import Expiry, Swept
from ...scopes import StorageKey
from ...store import AppendOutcome, DeleteOutcome, Erased, HistoryPage, Idempotency
from .._codec import encode
from .._modify import Change
from ..sql._program import Batch, Program, Rows, Statement, T, adrive
from ._common import (
    COMMIT,
    EDIT_LOCK_TIMEOUT,
    SQL,
    WRITE_LOCK_TIMEOUT,
    AsyncFace,
    PostgresOptions,
    TransactionState,
    connect_kwargs,
    unserialized,
)
from ._deadline import Deadline, arm, disarm
from ._errors import broken, mapped
from ._prepared import Replay, RoundTrip, Statements, Switch
from ._schema import quoted_schema
from ._tails import TailPrograms, Tails

__all__ = ["AsyncPostgresStore"]

Row = tuple[Any, ...]


class Connection(psycopg.AsyncConnection[Row]):
    """A pooled connection and its prepared statements: they live and die together."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.statements = Statements()
        self.born = time.monotonic()


async def _send(conn: Connection, trip: RoundTrip) -> list[Rows]:
    """Run ``trip`` (:class:`~flowmem.stores.postgres._prepared.RoundTrip`: a head and
    statements, prepared where its switch and the connection's cache say so); the rows
    of each.

    Sent on the connection's own protocol handle, not through a cursor: a cursor's
    per-result bookkeeping (descriptions, row makers, the prepared-statement cache)
    cost more client CPU than the round trip's I/O.
    """
    try:
        async with conn.lock:
            conn.pgconn.send_query(trip.sql)
            results = await conn.wait(execute(conn.pgconn))
    except BaseException:  # a cancellation too: what ran is not known
        trip.lost()
        raise
    return trip.rows(results)


class AsyncPostgresStore:
    """The PostgreSQL backend (see :mod:`flowmem.stores.postgres` for pooling and locking)."""

    def __init__(self, options: PostgresOptions) -> None:
        self.schema = options.schema
        self._options = options
        self._ident = quoted_schema(options.schema)
        self._switch = Switch(options.prepared)
        self._tails = Tails()
        self._pool: AsyncConnectionPool[Connection] | None = None
        self._opening = AsyncFace.lock()
        self._closed = False
        self._set_up = AsyncFace.set_up_now(options)
        # when a deadline last cut a connection (the server stopped answering): pooled
        # connections opened before it are not trusted again (each could cost a deadline)
        self._cut_at = float("-inf")

    @classmethod
    def from_url(cls, url: str) -> AsyncPostgresStore:
        """``postgresql://user@host:port/db?schema=...&pool_max=...`` (see
        :mod:`flowmem.stores.postgres`)."""
        return cls(PostgresOptions.from_url(url))

    async def _opened(self) -> AsyncConnectionPool[Connection]:
        if self._pool is not None:
            return self._pool
        async with self._opening:
            if self._closed:
                raise StoreError("the PostgreSQL store is closed")
            if self._pool is None:
                options = self._options
                if not self._set_up:
                    await AsyncFace.set_up(options)  # once: connect and migrate
                    self._set_up = True
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
        """A pooled connection for ``tx``, its deadline armed, and the first round trip.

        A pooled connection found dead on the first round trip (a restart, a
        proxy closing idle connections: nothing was done) is replaced, at most
        once per pooled connection; one the deadline cut is not, nor one that
        was sent a ``COMMIT``.
        """
        pool = await self._opened()
        for attempt in range(self._options.pool_max + 1):
            try:
                conn = await pool.getconn()
                while conn.born <= self._cut_at:  # opened before a deadline fired
                    await conn.close()  # nothing is waited for: the pool then drops it
                    await pool.putconn(conn)
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
                        and not tx.changed_maybe(lost) and attempt < self._options.pool_max):
                    continue
                if isinstance(exc, psycopg.Error):
                    raise mapped(exc, lost=lost, committing=tx.changed_maybe(lost),
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
        if deadline is not None and deadline.fired:
            self._cut_at = time.monotonic()  # the pool's older connections are suspect now
            return deadline.seconds
        return None

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
                raise mapped(exc, lost=lost, committing=tx.changed_maybe(lost),
                             timed_out=timed_out) from exc
            raise
        assert tx.conn is not None
        await self._give_back(tx.conn, tx.deadline, failed=False)

    async def _run(self, program: Callable[[], Program[T]], *, read_only: bool = False,
                   lock: tuple[StorageKey, float] | None = None) -> tuple[T, bool]:
        """Run the program ``program()`` makes in one transaction; its value and whether
        the transaction was serialized (MEM-12).

        Run once more — the only retry of a whole transaction — after a
        :class:`~flowmem.stores.postgres._prepared.Replay`: a statement the
        prepared-statement layer added failed, which aborted the transaction
        before its ``COMMIT`` (nothing of it is stored), and that layer now sends
        it unprepared.
        """
        try:
            return await self._once(program, read_only, lock)
        except Replay:
            return await self._once(program, read_only, lock)

    async def _value(self, program: Callable[[], Program[T]], *, read_only: bool = False,
                     lock: tuple[StorageKey, float] | None = None) -> T:
        """:meth:`_run`'s value alone."""
        value, _ = await self._run(program, read_only=read_only, lock=lock)
        return value

    async def _once(self, program: Callable[[], Program[T]], read_only: bool,
                    lock: tuple[StorageKey, float] | None) -> tuple[T, bool]:
        async with self._transaction(read_only=read_only, lock=lock) as tx:
            value = await adrive(program(), tx.execute, tx.batch)
        return value, tx.serialized

    # -- the store protocol ------------------------------------------------------
    async def read(self, key: StorageKey, *, now: float | None = None) -> tuple[bool, Any]:
        return await self._value(lambda: SQL.live_only(SQL.read(key), key, now, (False, None)),
                                 read_only=True)

    async def write(self, key: StorageKey, value: Any, *,
                    idempotency: Idempotency | None = None, replace: bool = False,
                    expiry: Expiry | None = None) -> bool:
        body = encode(value)
        return await self._value(lambda: SQL.write(key, body, idempotency, replace, expiry),
                        lock=(key, WRITE_LOCK_TIMEOUT))

    async def touch(self, key: StorageKey, expiry: Expiry) -> bool:
        """Move a live key's expiry (``refresh_on_read``)."""
        return await self._value(lambda: SQL.touch(key, expiry))

    async def sweep(self, now: float, *, batch: int = 500) -> Swept:
        """Delete up to ``batch`` keys expired by ``now`` in one transaction (retention)."""
        return await self._value(lambda: SQL.sweep(now, batch))

    async def modify(self, key: StorageKey, change: Change, timeout: float) -> tuple[bool, Any]:
        """Read-modify-write of the value at ``key`` in one transaction on one connection
        (:mod:`flowmem.stores._modify`): ``(found, value)`` afterwards."""
        return await self._value(lambda: SQL.modify(key, change), lock=(key, timeout))

    async def delete(self, key: StorageKey, *,
                     idempotency: Idempotency | None = None) -> DeleteOutcome:
        return await self._value(lambda: SQL.delete(key, idempotency),
                                 lock=(key, WRITE_LOCK_TIMEOUT))

    async def append(self, key: StorageKey, incoming: Sequence[Message], *,
                     max_messages: int | None, lock_timeout: float,
                     idempotency: Idempotency | None = None, tail: int = 0,
                     expiry: Expiry | None = None) -> AppendOutcome:
        # MEM-12: whether the lock was had is known once the first step ran
        outcome, serialized = await self._run(
            lambda: TailPrograms(self._tails).append(key, incoming, max_messages, True,
                                                     idempotency, tail, expiry=expiry),
            lock=(key, lock_timeout))
        return outcome if serialized else replace(outcome, serialized=False)

    async def history(self, key: StorageKey, *, last: int | None = None,
                      before: int | None = None, now: float | None = None) -> HistoryPage:
        return await self._value(lambda: SQL.live_only(SQL.history(key, last, before), key, now,
                                                       HistoryPage(total=0)), read_only=True)

    async def edit(self, key: StorageKey, position: int, message: Message | None) -> bool:
        return await self._value(lambda: SQL.edit(key, position, message),
                                 lock=(key, EDIT_LOCK_TIMEOUT))

    async def keys(self, scope: str, scope_id: str, *, prefix: str = "",
                   after: str | None = None, limit: int = 100,
                   now: float | None = None) -> list[str]:
        return await self._value(lambda: SQL.keys(scope, scope_id, prefix, after, limit, now),
                                 read_only=True)

    async def erase(self, scope: str, scope_id: str, *, dry_run: bool = False) -> Erased:
        """The fence, then one transaction per key under its MEM-12 lock
        (:mod:`flowmem.stores.sql._erasure`)."""
        if not dry_run:
            await self._value(lambda: SQL.raise_fence(scope, scope_id))
        total, after = Erased(), ""
        while page := await self._value(partial(SQL.erasable, scope, scope_id, after),
                                        read_only=True):
            for name, _ in page:
                key = StorageKey(scope, scope_id, name)
                total += await self._value(partial(SQL.erase_key, key, dry_run),
                                           read_only=dry_run, lock=(key, WRITE_LOCK_TIMEOUT))
            after = page[-1][0]
        if not dry_run:
            await self._value(lambda: SQL.lower_fence(scope, scope_id))
        return total

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
    """One transaction of the store, opened by its first round trip.

    That round trip carries ``BEGIN``, the settings and the MEM-12 lock
    (:func:`~flowmem.stores.postgres._common.begin`) with the program's first
    step; a final :class:`~flowmem.stores.sql._program.Batch` carries the
    ``COMMIT``. Each step is one round trip.
    """

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
            rows = await _send(self.conn, RoundTrip(self.conn, self.store._switch, statements))
        self.committed = batch.final
        return rows[:len(batch.statements)]

    async def first(self, conn: Connection, statements: Sequence[Statement]) -> list[Rows]:
        """The first round trip on ``conn``: :attr:`begin`, then ``statements``."""
        opening, switch = self.begin, self.store._switch
        trip = RoundTrip(conn, switch, statements, opening)
        try:
            rows = await _send(conn, trip)
        except pg_errors.LockNotAvailable:
            if not opening.waits or trip.failed != opening.count:
                raise  # (past the lock statement: the row stayed locked, StoreBusy)
            self.serialized = False  # MEM-12: the lock's wait timed out
            opening = unserialized(self.store._ident, self.store._options.statement_timeout)
            return (await _send(conn, RoundTrip(conn, switch, statements, opening)))[
                opening.count:]
        if opening.tries:  # MEM-12: tried once; its row says whether it was had
            self.serialized = bool(rows[opening.count][0][0])
        return rows[opening.count + len(opening.lock):]

    async def commit(self) -> None:
        if not self.committed:
            await self.batch(Batch((), final=True))
