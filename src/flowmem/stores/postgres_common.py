"""What the blocking and the asyncio PostgreSQL stores share: the URL, the
MEM-12 lock id, the first round trip's statements and the error mapping.

Only the I/O differs between :mod:`flowmem.stores.postgres` and
:mod:`flowmem.stores.postgres_async`; the SQL of every operation is the
programs of :mod:`flowmem.stores.sql`.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..errors import InvalidStoreURL, MissingDependency, StoreBusy, StoreError, StoreUnavailable
from ..scopes import StorageKey

try:
    import psycopg
    from psycopg.pq import TransactionStatus
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency("psycopg", "postgres") from exc
try:
    from psycopg_pool import PoolClosed, PoolTimeout
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency("psycopg_pool", "postgres") from exc

from .sql import SQLConversations

__all__ = [
    "EDIT_LOCK_TIMEOUT",
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
]

OPTIONS: Final = ("schema", "pool_min", "pool_max", "pool_timeout")
WRITE_LOCK_TIMEOUT: Final = 5.0  # write/delete wait this long for the key's lock
EDIT_LOCK_TIMEOUT: Final = 30.0  # the administrative edit, as on SQLite
SAVEPOINT: Final = "flowmem_mem12"
SQL: Final = SQLConversations(lock_row=" FOR UPDATE")
_MAX_TIMEOUT_MS: Final = 2**31 - 1
_UNAVAILABLE_STATES: Final = ("57P01", "57P02", "57P03")  # shutdown, crash, cannot connect now
_BUSY_STATES: Final = ("55P03", "40P01", "40001")  # lock timeout, deadlock, serialization


@dataclass(frozen=True, slots=True)
class PostgresOptions:
    """A PostgreSQL store URL, parsed: libpq's part and flowmem's options."""

    conninfo: str
    schema: str = "flowmem"
    pool_min: int = 1
    pool_max: int = 10
    pool_timeout: float = 30.0

    def __post_init__(self) -> None:
        if (not 0 <= self.pool_min <= self.pool_max or self.pool_max < 1
                or not self.pool_timeout > 0):
            raise InvalidStoreURL(
                f"need 0 <= pool_min <= pool_max, pool_max >= 1 and pool_timeout > 0; got "
                f"{self.pool_min}, {self.pool_max}, {self.pool_timeout}")

    @classmethod
    def from_url(cls, url: str) -> PostgresOptions:
        """``postgresql://user@host:port/db?schema=...&pool_max=...`` (the rest goes to libpq)."""
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
                       pool_timeout=float(ours.get("pool_timeout", 30.0)))
        except ValueError:
            raise InvalidStoreURL(f"pool_min/pool_max must be integers and pool_timeout "
                                  f"seconds, in {url!r}") from None


def connect_kwargs(conninfo: str) -> dict[str, Any]:
    """psycopg connection arguments: autocommit (flowmem says BEGIN), nothing prepared
    (pgbouncer transaction pooling), a connect timeout unless the URL sets one."""
    kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": None}
    if "connect_timeout" not in conninfo:
        kwargs["connect_timeout"] = 10
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


def begin_statement(schema_ident: str, read_only: bool, lock: tuple[int, float] | None) -> str:
    """The first round trip: BEGIN, the search path and, for a writer, the MEM-12 lock.

    With a lock and a positive timeout the lock is taken under ``lock_timeout``
    after a savepoint; on :class:`psycopg.errors.LockNotAvailable` the caller
    runs :func:`lock_fallback_statement` and goes ahead unserialized. With a
    timeout ≤ 0 the statement tries the lock once and returns whether it was had.
    """
    mode = "REPEATABLE READ READ ONLY" if read_only else "READ COMMITTED"
    head = f"BEGIN ISOLATION LEVEL {mode}; SET LOCAL search_path TO {schema_ident}"
    if lock is None:
        return head
    lock_id, timeout = lock
    literal = f"'{lock_id}'::bigint"
    if timeout <= 0:
        return f"{head}; SELECT pg_try_advisory_xact_lock({literal})"
    # set_config(..., NULL, true) = SET LOCAL lock_timeout TO DEFAULT, once the lock is had
    return (f"{head}; SET LOCAL lock_timeout = {_timeout_ms(timeout)}; SAVEPOINT {SAVEPOINT}; "
            f"SELECT pg_advisory_xact_lock({literal}), set_config('lock_timeout', NULL, true)")


def lock_fallback_statement() -> str:
    """After the lock wait timed out: back to the savepoint, then on unserialized (MEM-12)."""
    return f"ROLLBACK TO SAVEPOINT {SAVEPOINT}; SET LOCAL lock_timeout TO DEFAULT"


def broken(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether a connection can no longer be trusted (closed, or its state unknown)."""
    return conn.closed or conn.info.transaction_status == TransactionStatus.UNKNOWN


def mapped(exc: BaseException, *, lost: bool = False, committing: bool = False) -> StoreError:
    """psycopg's and the pool's errors as flowmem's (never a driver exception outside)."""
    if isinstance(exc, PoolClosed):
        return StoreError("the PostgreSQL store is closed")
    if isinstance(exc, PoolTimeout):
        return StoreUnavailable(f"no PostgreSQL connection in time (server unreachable "
                                f"or pool exhausted): {exc}")
    state = getattr(exc, "sqlstate", None) or ""
    if (lost or state.startswith("08") or state in _UNAVAILABLE_STATES
            or (isinstance(exc, psycopg.OperationalError) and not state)):
        if committing:
            return StoreUnavailable(f"PostgreSQL connection lost during COMMIT; the "
                                    f"operation may or may not have been stored: {exc}")
        return StoreUnavailable(f"PostgreSQL connection lost; nothing was stored: {exc}")
    if state in _BUSY_STATES:
        return StoreBusy(f"PostgreSQL lock wait failed ({state}): {exc}")
    return StoreError(f"PostgreSQL error ({state or 'client'}): {exc}")
