"""How a failure of psycopg or its pool becomes a flowmem error, on both faces.

No driver exception leaves the PostgreSQL store: :func:`mapped` turns each into a
:class:`~flowmem.errors.StoreError` that says whether anything was stored —
``StoreUnavailable`` (nothing was), ``OutcomeUnknown`` (the COMMIT may have run:
retry with the same idempotency key), ``StoreBusy`` (a lock wait failed).
:func:`broken` says when a connection can no longer be trusted.
"""

from __future__ import annotations

from typing import Any, Final

from ...errors import (
    MissingDependency,
    OutcomeUnknown,
    StoreBusy,
    StoreError,
    StoreUnavailable,
)

try:
    import psycopg
    from psycopg.pq import TransactionStatus
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency("psycopg", "postgres") from exc
try:
    from psycopg_pool import PoolClosed, PoolTimeout
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency("psycopg_pool", "postgres") from exc

__all__ = ["broken", "mapped"]

_UNAVAILABLE_STATES: Final = ("57P01", "57P02", "57P03")  # shutdown, crash, cannot connect now
_BUSY_STATES: Final = ("55P03", "40P01", "40001")  # lock timeout, deadlock, serialization
_RETRY: Final = "retry with the same idempotency key (it is then stored once)"
_STATEMENT_TIMEOUT: Final = "57014"  # query_canceled: statement_timeout (or a cancel request)


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
    if timed_out is not None:
        if committing:  # the COMMIT may have run: the answer is what was lost
            return OutcomeUnknown(f"PostgreSQL did not answer within {timed_out:.1f}s "
                                  f"(server stopped, hung or unreachable) during COMMIT; the "
                                  f"connection was closed and the operation may or may not "
                                  f"have been stored: {_RETRY}")
        return StoreUnavailable(f"PostgreSQL did not answer within {timed_out:.1f}s (server "
                                f"stopped, hung or unreachable); the connection was closed "
                                f"and nothing was stored")
    state = getattr(exc, "sqlstate", None) or ""
    if state == _STATEMENT_TIMEOUT:  # the server's own error: its transaction rolled back
        return StoreUnavailable(f"PostgreSQL statement ran past statement_timeout (server "
                                f"overloaded or stalled); nothing was stored: {exc}")
    if (lost or state.startswith("08") or state in _UNAVAILABLE_STATES
            or (isinstance(exc, psycopg.OperationalError) and not state)):
        if committing:
            return OutcomeUnknown(f"PostgreSQL connection lost during COMMIT; the operation "
                                  f"may or may not have been stored: {_RETRY}: {exc}")
        return StoreUnavailable(f"PostgreSQL connection lost; nothing was stored: {exc}")
    if state in _BUSY_STATES:
        return StoreBusy(f"PostgreSQL lock wait failed ({state}): {exc}")
    return StoreError(f"PostgreSQL error ({state or 'client'}): {exc}")
