"""``postgresql://…`` for :class:`~flowmem.AsyncMemory`: psycopg's asyncio pool.

The asyncio twin of :mod:`flowmem.stores.postgres`: the same URL, the same
first round trip (BEGIN, search path, statement timeout and the MEM-12
advisory lock under a ``lock_timeout``), the same SQL programs
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
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from typing import Any

from ..errors import MissingDependency, StoreError

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg_pool import AsyncConnectionPool
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency(exc.name or "psycopg", "postgres") from exc

from ..messages import Message
from ..scopes import StorageKey
from ..store import AppendOutcome, HistoryPage, Idempotency
from .postgres import setup
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
    row_wait_statement,
)
from .postgres_schema import quoted_schema
from .postgres_watchdog import Deadline, arm, disarm
from .sql import AsyncExecute, Program, T, adrive, encode

__all__ = ["AsyncPostgresStore"]

Row = tuple[Any, ...]
Connection = psycopg.AsyncConnection[Row]
Cursor = psycopg.AsyncCursor[Row]


def _executor(cur: Cursor) -> AsyncExecute:
    async def run(statement: str, params: Sequence[Any]) -> list[Row]:
        await cur.execute(pg(statement), tuple(params))
        return await cur.fetchall() if cur.description is not None else []

    return run


class AsyncPostgresStore:
    """The PostgreSQL backend for asyncio (see the module notes)."""

    def __init__(self, options: PostgresOptions) -> None:
        self.schema = options.schema
        self._options = options
        self._ident = quoted_schema(options.schema)
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
                    options.conninfo, kwargs=connect_kwargs(options.conninfo),
                    min_size=options.pool_min, max_size=options.pool_max,
                    timeout=options.pool_timeout, open=False, name=f"flowmem-{self.schema}")
                await pool.open()
                self._pool = pool
        return self._pool

    # -- transactions ---------------------------------------------------------------
    async def _begin(self, cur: Cursor, read_only: bool,
                     lock: tuple[StorageKey, float] | None) -> bool:
        """The first round trip; whether the MEM-12 lock was had."""
        held = None if lock is None else (advisory_key(self.schema, lock[0]), lock[1])
        seconds = self._options.statement_timeout
        began = time.monotonic()
        try:
            await cur.execute(begin_statement(self._ident, read_only, held, seconds))
        except pg_errors.LockNotAvailable:
            await cur.execute(lock_fallback_statement(seconds))
            return False
        if held is None:
            return True
        if held[1] > 0:
            shorter = row_wait_statement(held[1], time.monotonic() - began)
            if shorter is not None:  # the lock came late: the row gets what is left
                await cur.execute(shorter)
            return True
        while cur.nextset():
            pass
        row = await cur.fetchone()
        return bool(row and row[0])

    async def _open(self, read_only: bool, lock: tuple[StorageKey, float] | None,
                    ) -> tuple[Connection, Deadline | None, bool]:
        """A pooled connection, its deadline armed and its transaction begun (a pooled
        connection found dead on the first round trip is replaced, as on the blocking face)."""
        pool = await self._opened()
        budget = self._options.budget(None if lock is None else lock[1])
        for attempt in range(self._options.pool_max + 1):
            try:
                conn = await pool.getconn()
            except psycopg.Error as exc:
                raise mapped(exc) from exc
            deadline: Deadline | None = None
            try:
                deadline = arm(conn, budget)
                return conn, deadline, await self._begin(conn.cursor(), read_only, lock)
            except BaseException as exc:
                lost = broken(conn)
                timed_out = await self._give_back(conn, deadline, failed=True)
                if (lost and timed_out is None and isinstance(exc, psycopg.Error)
                        and attempt < self._options.pool_max):
                    continue
                if isinstance(exc, psycopg.Error):
                    raise mapped(exc, lost=lost, timed_out=timed_out) from exc
                raise
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
                           holding: bool = False) -> AsyncIterator[tuple[AsyncExecute, bool]]:
        """One transaction under the operation's deadline; ``holding``: the caller's block
        runs inside it (the deadline is then off while the block runs)."""
        conn, deadline, serialized = await self._open(read_only, lock)
        committing = False
        try:
            cur = conn.cursor()
            if holding:
                disarm(deadline)
                deadline = None
                try:
                    yield _executor(cur), serialized
                finally:
                    with suppress(psycopg.Error):  # a lost connection fails at COMMIT
                        deadline = arm(conn, self._options.budget(None))
            else:
                yield _executor(cur), serialized
            committing = True
            await cur.execute("COMMIT")
        except BaseException as exc:
            lost = broken(conn)
            timed_out = await self._give_back(conn, deadline, failed=True)
            if isinstance(exc, psycopg.Error):
                raise mapped(exc, lost=lost, committing=committing,
                             timed_out=timed_out) from exc
            raise
        await self._give_back(conn, deadline, failed=False)

    async def _run(self, program: Program[T], *, read_only: bool = False,
                   lock: tuple[StorageKey, float] | None = None) -> T:
        async with self._transaction(read_only=read_only, lock=lock) as (run, _):
            return await adrive(program, run)

    # -- the AsyncStore protocol ---------------------------------------------------------
    async def read(self, key: StorageKey) -> tuple[bool, Any]:
        return await self._run(SQL.read(key), read_only=True)

    async def write(self, key: StorageKey, value: Any, *,
                    idempotency: Idempotency | None = None) -> None:
        await self._run(SQL.write(key, encode(value), idempotency), lock=(key, WRITE_LOCK_TIMEOUT))

    async def delete(self, key: StorageKey, *, idempotency: Idempotency | None = None) -> bool:
        return await self._run(SQL.delete(key, idempotency), lock=(key, WRITE_LOCK_TIMEOUT))

    async def append(self, key: StorageKey, incoming: Sequence[Message], *,
                     max_messages: int | None, lock_timeout: float,
                     idempotency: Idempotency | None = None) -> AppendOutcome:
        async with self._transaction(lock=(key, lock_timeout)) as (run, serialized):
            program = SQL.append(key, incoming, max_messages, serialized, idempotency)
            return await adrive(program, run)

    async def history(self, key: StorageKey, *, last: int | None = None,
                      before: int | None = None) -> HistoryPage:
        return await self._run(SQL.history(key, last, before), read_only=True)

    async def edit(self, key: StorageKey, position: int, message: Message | None) -> bool:
        return await self._run(SQL.edit(key, position, message), lock=(key, EDIT_LOCK_TIMEOUT))

    async def keys(self, scope: str, scope_id: str, *, prefix: str = "",
                   after: str | None = None, limit: int = 100) -> list[str]:
        return await self._run(SQL.keys(scope, scope_id, prefix, after, limit), read_only=True)

    def lock(self, key: StorageKey, timeout: float) -> AbstractAsyncContextManager[bool]:
        """Hold ``key``'s advisory lock in a transaction of its own while the block runs."""
        return self._hold(key, timeout)

    @asynccontextmanager
    async def _hold(self, key: StorageKey, timeout: float) -> AsyncIterator[bool]:
        async with self._transaction(lock=(key, timeout), holding=True) as (_, serialized):
            yield serialized

    async def aclose(self) -> None:
        async with self._opening:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
