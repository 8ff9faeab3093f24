"""A PostgreSQL store's options: flowmem's own from the URL, libpq's defaults for the rest."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Final

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import version as libpq_version

from ...errors import InvalidStoreURL
from .._urls import URLOptions
from ._schema import MAX_PARTITIONS

__all__ = ["ANSWER_MARGIN", "LIBPQ_DEFAULTS", "OPTIONS", "ROW_LOCK_GRACE", "PostgresOptions",
           "connect_kwargs"]

ROW_LOCK_GRACE: Final = 0.5
"""Seconds a writer may still wait for the conversation's row once its MEM-12
lock wait is spent (the lock came late, or the append runs unserialized)."""
ANSWER_MARGIN: Final = 1.0  # the client's deadline allows this much beyond the server's bounds

OPTIONS: Final = ("schema", "pool_min", "pool_max", "pool_timeout", "statement_timeout",
                  "prepared", "partitions", "listen")
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
    (:mod:`flowmem.stores.postgres._prepared`); ``false`` behind a transaction-pooling proxy."""
    partitions: int | None = None
    """Hash-partition each table by its conversation key in this many partitions when the
    schema is created (0: none); ``None``: whatever the schema has (none for a new one).
    A number that differs from the schema's is refused."""
    listen: str | None = None
    """Where serving processes LISTEN for change notices (libpq URL; ``None``: the store's
    own). Behind a transaction-pooling proxy, the PostgreSQL server itself."""

    def __post_init__(self) -> None:
        if self.partitions is not None and not 0 <= self.partitions <= MAX_PARTITIONS:
            raise InvalidStoreURL(f"partitions must be 0 to {MAX_PARTITIONS}, got "
                                  f"{self.partitions}")
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
        options = URLOptions(url, OPTIONS)
        if options.parts.scheme.lower() not in ("postgresql", "postgres"):
            raise InvalidStoreURL(f"not a PostgreSQL URL: {url!r}")
        return cls(options.url_for_driver(), schema=options.text("schema", "flowmem"),
                   pool_min=options.integer("pool_min", 1, 0, 10_000),
                   pool_max=options.integer("pool_max", 10, 1, 10_000),
                   pool_timeout=options.seconds("pool_timeout", 5.0),
                   statement_timeout=options.seconds("statement_timeout", 5.0),
                   prepared=bool(options.boolean("prepared", True)),
                   partitions=options.integer("partitions", None, 0, MAX_PARTITIONS),
                   listen=options.text("listen", "") or None)


def connect_kwargs(conninfo: str) -> dict[str, Any]:
    """psycopg connection arguments: autocommit (flowmem says BEGIN), nothing prepared by
    psycopg (flowmem's own round trips prepare at the SQL level, if at all:
    :mod:`flowmem.stores.postgres._prepared`), and :data:`LIBPQ_DEFAULTS` the URL does not set."""
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
