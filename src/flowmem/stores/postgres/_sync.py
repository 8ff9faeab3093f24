# GENERATED FILE — do not edit. Written by scripts/unasync.py from _async.py
# (the asyncio face) by token substitution; edit _async.py or _common.py, then run
# `python scripts/unasync.py` (`--check` fails when this file is stale).
"""One face of the PostgreSQL store: the I/O around the sans-I/O programs.

This file is the source of both faces: ``_sync.py`` (the blocking face) is
generated from it by ``scripts/unasync.py``, token by token (a coroutine
function becomes a function, nothing is awaited, a name loses its ``Async``
prefix, ...);
``scripts/unasync.py --check`` fails when the generated file is stale. What
the faces cannot share that way is in :mod:`flowmem.stores.postgres._common`
(:class:`~flowmem.stores.postgres._common.Face`). The round trips,
the bounds of every wait, MEM-12, failures and cancellation are described in
:mod:`flowmem.stores.postgres`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import replace
from functools import partial
from typing import Any

from ...errors import MissingDependency, StoreError

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg.generators import execute
    from psycopg_pool import ConnectionPool
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency(exc.name or "psycopg", "postgres") from exc

from ...messages import Message
from ...retention import Expiry, Swept
from ...scopes import StorageKey
from ...store import AppendOutcome, DeleteOutcome, Erased, HistoryPage, Idempotency
from .._codec import encode
from .._modify import Change
from ..sql._program import Batch, Program, Rows, Statement, T, drive
from ._common import (
    COMMIT,
    EDIT_LOCK_TIMEOUT,
    SQL,
    WRITE_LOCK_TIMEOUT,
    Face,
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

__all__ = ["PostgresStore"]

Row = tuple[Any, ...]


class Connection(psycopg.Connection[Row]):
    """A pooled connection and its prepared statements: they live and die together."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.statements = Statements()
        self.born = time.monotonic()


def _send(conn: Connection, trip: RoundTrip) -> list[Rows]:
    """Run ``trip`` (:class:`~flowmem.stores.postgres._prepared.RoundTrip`: a head and
    statements, prepared where its switch and the connection's cache say so); the rows
    of each.

    Sent on the connection's own protocol handle, not through a cursor: a cursor's
    per-result bookkeeping (descriptions, row makers, the prepared-statement cache)
    cost more client CPU than the round trip's I/O.
    """
    try:
        with conn.lock:
            conn.pgconn.send_query(trip.sql)
            results = conn.wait(execute(conn.pgconn))
    except BaseException:  # a cancellation too: what ran is not known
        trip.lost()
        raise
    return trip.rows(results)


class PostgresStore:
    """The PostgreSQL backend (see :mod:`flowmem.stores.postgres` for pooling and locking)."""

    def __init__(self, options: PostgresOptions) -> None:
        self.schema = options.schema
        self._options = options
        self._ident = quoted_schema(options.schema)
        self._switch = Switch(options.prepared)
        self._tails = Tails()
        self._pool: ConnectionPool[Connection] | None = None
        self._opening = Face.lock()
        self._closed = False
        self._set_up = Face.set_up_now(options)
        # when a deadline last cut a connection (the server stopped answering): pooled
        # connections opened before it are not trusted again (each could cost a deadline)
        self._cut_at = float("-inf")

    @classmethod
    def from_url(cls, url: str) -> PostgresStore:
        """``postgresql://user@host:port/db?schema=...&pool_max=...`` (see
        :mod:`flowmem.stores.postgres`)."""
        return cls(PostgresOptions.from_url(url))

    def _opened(self) -> ConnectionPool[Connection]:
        if self._pool is not None:
            return self._pool
        with self._opening:
            if self._closed:
                raise StoreError("the PostgreSQL store is closed")
            if self._pool is None:
                options = self._options
                if not self._set_up:
                    Face.set_up(options)  # once: connect and migrate
                    self._set_up = True
                pool: ConnectionPool[Connection] = ConnectionPool(
                    options.conninfo, connection_class=Connection,
                    kwargs=connect_kwargs(options.conninfo),
                    min_size=options.pool_min, max_size=options.pool_max,
                    timeout=options.pool_timeout, open=False, name=f"flowmem-{self.schema}")
                pool.open()
                self._pool = pool
        return self._pool

    # -- transactions ---------------------------------------------------------------
    def _connect(self, tx: _Transaction, statements: Sequence[Statement]) -> list[Rows]:
        """A pooled connection for ``tx``, its deadline armed, and the first round trip.

        A pooled connection found dead on the first round trip (a restart, a
        proxy closing idle connections: nothing was done) is replaced, at most
        once per pooled connection; one the deadline cut is not, nor one that
        was sent a ``COMMIT``.
        """
        pool = self._opened()
        for attempt in range(self._options.pool_max + 1):
            try:
                conn = pool.getconn()
                while conn.born <= self._cut_at:  # opened before a deadline fired
                    conn.close()  # nothing is waited for: the pool then drops it
                    pool.putconn(conn)
                    conn = pool.getconn()
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
                        and not tx.changed_maybe(lost) and attempt < self._options.pool_max):
                    continue
                if isinstance(exc, psycopg.Error):
                    raise mapped(exc, lost=lost, committing=tx.changed_maybe(lost),
                                 timed_out=timed_out) from exc
                raise
            tx.conn, tx.deadline = conn, deadline
            return rows
        raise AssertionError("unreachable")

    def _give_back(self, conn: Connection, deadline: Deadline | None, *,
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
                conn.execute("ROLLBACK")
                usable = True
        except psycopg.Error:
            pass
        finally:
            disarm(deadline)
            if not usable:
                conn.close()  # mid-statement or lost: the server rolls back and unlocks
            if self._pool is not None:
                with suppress(psycopg.Error):
                    self._pool.putconn(conn)
        if deadline is not None and deadline.fired:
            self._cut_at = time.monotonic()  # the pool's older connections are suspect now
            return deadline.seconds
        return None

    @contextmanager
    def _transaction(self, *, read_only: bool = False,
                     lock: tuple[StorageKey, float] | None = None,
                     ) -> Iterator[_Transaction]:
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
                raise mapped(exc, lost=lost, committing=tx.changed_maybe(lost),
                             timed_out=timed_out) from exc
            raise
        assert tx.conn is not None
        self._give_back(tx.conn, tx.deadline, failed=False)

    def _run(self, program: Callable[[], Program[T]], *, read_only: bool = False,
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
            return self._once(program, read_only, lock)
        except Replay:
            return self._once(program, read_only, lock)

    def _value(self, program: Callable[[], Program[T]], *, read_only: bool = False,
               lock: tuple[StorageKey, float] | None = None) -> T:
        """:meth:`_run`'s value alone."""
        value, _ = self._run(program, read_only=read_only, lock=lock)
        return value

    def _once(self, program: Callable[[], Program[T]], read_only: bool,
              lock: tuple[StorageKey, float] | None) -> tuple[T, bool]:
        with self._transaction(read_only=read_only, lock=lock) as tx:
            value = drive(program(), tx.execute, tx.batch)
        return value, tx.serialized

    # -- the store protocol ------------------------------------------------------
    def read(self, key: StorageKey, *, now: float | None = None) -> tuple[bool, Any]:
        return self._value(lambda: SQL.live_only(SQL.read(key), key, now, (False, None)),
                           read_only=True)

    def write(self, key: StorageKey, value: Any, *,
              idempotency: Idempotency | None = None, replace: bool = False,
              expiry: Expiry | None = None) -> bool:
        body = encode(value)
        return self._value(lambda: SQL.write(key, body, idempotency, replace, expiry),
                  lock=(key, WRITE_LOCK_TIMEOUT))

    def touch(self, key: StorageKey, expiry: Expiry) -> bool:
        """Move a live key's expiry (``refresh_on_read``)."""
        return self._value(lambda: SQL.touch(key, expiry))

    def sweep(self, now: float, *, batch: int = 500) -> Swept:
        """Delete up to ``batch`` keys expired by ``now`` in one transaction (retention)."""
        return self._value(lambda: SQL.sweep(now, batch))

    def modify(self, key: StorageKey, change: Change, timeout: float) -> tuple[bool, Any]:
        """Read-modify-write of the value at ``key`` in one transaction on one connection
        (:mod:`flowmem.stores._modify`): ``(found, value)`` afterwards."""
        return self._value(lambda: SQL.modify(key, change), lock=(key, timeout))

    def delete(self, key: StorageKey, *,
               idempotency: Idempotency | None = None) -> DeleteOutcome:
        return self._value(lambda: SQL.delete(key, idempotency),
                           lock=(key, WRITE_LOCK_TIMEOUT))

    def append(self, key: StorageKey, incoming: Sequence[Message], *,
               max_messages: int | None, lock_timeout: float,
               idempotency: Idempotency | None = None, tail: int = 0,
               expiry: Expiry | None = None) -> AppendOutcome:
        # MEM-12: whether the lock was had is known once the first step ran
        outcome, serialized = self._run(
            lambda: TailPrograms(self._tails).append(key, incoming, max_messages, True,
                                                     idempotency, tail, expiry=expiry),
            lock=(key, lock_timeout))
        return outcome if serialized else replace(outcome, serialized=False)

    def history(self, key: StorageKey, *, last: int | None = None,
                before: int | None = None, now: float | None = None) -> HistoryPage:
        return self._value(lambda: SQL.live_only(SQL.history(key, last, before), key, now,
                                                 HistoryPage(total=0)), read_only=True)

    def edit(self, key: StorageKey, position: int, message: Message | None) -> bool:
        return self._value(lambda: SQL.edit(key, position, message),
                           lock=(key, EDIT_LOCK_TIMEOUT))

    def keys(self, scope: str, scope_id: str, *, prefix: str = "",
             after: str | None = None, limit: int = 100,
             now: float | None = None) -> list[str]:
        return self._value(lambda: SQL.keys(scope, scope_id, prefix, after, limit, now),
                           read_only=True)

    def erase(self, scope: str, scope_id: str, *, dry_run: bool = False) -> Erased:
        """The fence, then one transaction per key under its MEM-12 lock
        (:mod:`flowmem.stores.sql._erasure`)."""
        if not dry_run:
            self._value(lambda: SQL.raise_fence(scope, scope_id))
        total, after = Erased(), ""
        while page := self._value(partial(SQL.erasable, scope, scope_id, after),
                                  read_only=True):
            for name, _ in page:
                key = StorageKey(scope, scope_id, name)
                total += self._value(partial(SQL.erase_key, key, dry_run),
                                     read_only=dry_run, lock=(key, WRITE_LOCK_TIMEOUT))
            after = page[-1][0]
        if not dry_run:
            self._value(lambda: SQL.lower_fence(scope, scope_id))
        return total

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
        with self._opening:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


class _Transaction(TransactionState):
    """One transaction of the store, opened by its first round trip.

    That round trip carries ``BEGIN``, the settings and the MEM-12 lock
    (:func:`~flowmem.stores.postgres._common.begin`) with the program's first
    step; a final :class:`~flowmem.stores.sql._program.Batch` carries the
    ``COMMIT``. Each step is one round trip.
    """

    def __init__(self, store: PostgresStore, read_only: bool,
                 lock: tuple[StorageKey, float] | None) -> None:
        super().__init__(store._options, store._ident, store.schema, read_only, lock)
        self.store = store
        self.conn: Connection | None = None

    def execute(self, sql: str, params: Sequence[Any]) -> Rows:
        return (self.batch(Batch(((sql, params),))))[0]

    def batch(self, batch: Batch) -> list[Rows]:
        statements = (*batch.statements, COMMIT) if batch.final else batch.statements
        self.committing = batch.final
        if self.conn is None:
            rows = self.store._connect(self, statements)
        else:
            rows = _send(self.conn, RoundTrip(self.conn, self.store._switch, statements))
        self.committed = batch.final
        return rows[:len(batch.statements)]

    def first(self, conn: Connection, statements: Sequence[Statement]) -> list[Rows]:
        """The first round trip on ``conn``: :attr:`begin`, then ``statements``."""
        opening, switch = self.begin, self.store._switch
        trip = RoundTrip(conn, switch, statements, opening)
        try:
            rows = _send(conn, trip)
        except pg_errors.LockNotAvailable:
            if not opening.waits or trip.failed != opening.count:
                raise  # (past the lock statement: the row stayed locked, StoreBusy)
            self.serialized = False  # MEM-12: the lock's wait timed out
            opening = unserialized(self.store._ident, self.store._options.statement_timeout)
            return (_send(conn, RoundTrip(conn, switch, statements, opening)))[
                opening.count:]
        if opening.tries:  # MEM-12: tried once; its row says whether it was had
            self.serialized = bool(rows[opening.count][0][0])
        return rows[opening.count + len(opening.lock):]

    def commit(self) -> None:
        if not self.committed:
            self.batch(Batch((), final=True))
