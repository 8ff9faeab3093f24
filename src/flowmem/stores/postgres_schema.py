"""The PostgreSQL schema of flowmem: versioned migrations and the setup that runs them.

The tables are those of :mod:`flowmem.stores.sql` (the SQLite ones, typed for
PostgreSQL): ``BIGINT`` positions, ``healed`` an integer, and every key or id
column ``COLLATE "C"`` so keys sort by code point exactly as on SQLite. They
live in one dedicated schema (``flowmem`` unless the URL says otherwise).

:func:`migrate` is safe to repeat and safe to run from many processes at
once: a quick read of ``schema_version`` returns when the schema is current;
otherwise the work runs in one transaction holding a transaction-level
advisory lock (two-key form, so it never collides with the MEM-12 locks),
re-reads the version and applies only the missing migrations.
"""

from __future__ import annotations

import hashlib
import re
from contextlib import suppress
from typing import Any, Final

from psycopg import Cursor
from psycopg.pq import TransactionStatus

from ..errors import InvalidStoreURL, SchemaError

__all__ = ["MIGRATIONS", "SCHEMA_NAME", "migrate", "quoted_schema", "stored_version"]

SCHEMA_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
"""A schema name flowmem accepts (an unquoted-style identifier, any case)."""

_MIGRATION_LOCK_CLASS: Final = 0x466D656D  # "Fmem": first key of the two-key advisory lock

_C = 'TEXT COLLATE "C" NOT NULL'

MIGRATIONS: Final[tuple[str, ...]] = (
    f"""
    CREATE TABLE kv (
        scope {_C}, scope_id {_C}, key {_C},
        value TEXT NOT NULL,
        PRIMARY KEY (scope, scope_id, key)
    );
    CREATE TABLE buffers (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        scope {_C}, scope_id {_C}, key {_C},
        count BIGINT NOT NULL DEFAULT 0,
        next_pos BIGINT NOT NULL DEFAULT 0,
        UNIQUE (scope, scope_id, key)
    ) WITH (fillfactor = 50);
    CREATE TABLE messages (
        buffer_id BIGINT NOT NULL,
        pos BIGINT NOT NULL,
        role {_C},
        result_id TEXT COLLATE "C",
        healed INTEGER NOT NULL DEFAULT 0,
        body TEXT NOT NULL,
        PRIMARY KEY (buffer_id, pos)
    );
    CREATE UNIQUE INDEX messages_result ON messages (buffer_id, result_id)
        WHERE result_id IS NOT NULL;
    CREATE TABLE calls (
        buffer_id BIGINT NOT NULL, call_id {_C},
        turn_pos BIGINT NOT NULL, ord INTEGER NOT NULL,
        PRIMARY KEY (buffer_id, call_id, turn_pos)
    );
    CREATE INDEX calls_turn ON calls (buffer_id, turn_pos);
    CREATE TABLE pending (
        buffer_id BIGINT NOT NULL, call_id {_C},
        turn_pos BIGINT NOT NULL, ord INTEGER NOT NULL,
        PRIMARY KEY (buffer_id, call_id)
    );
    """,
    f"""
    CREATE TABLE idempotency (
        ikey {_C} PRIMARY KEY, fingerprint TEXT NOT NULL, outcome TEXT,
        expires DOUBLE PRECISION NOT NULL
    );
    CREATE INDEX idempotency_expires ON idempotency (expires);
    """,
    # 3: the unanswered calls move into their buffer's row, as on SQLite (schema 4 there;
    # :class:`~flowmem.stores.sql_apply.PendingInRow`): a table whose every row is deleted
    # soon after it is inserted left its index full of dead entries until a vacuum, and
    # a healing append's read of them grew with the calls ever opened (autovacuum off:
    # 3-6 ms at 100,000 messages). The row is rewritten by every append anyway.
    """
    ALTER TABLE buffers ADD COLUMN pending TEXT NOT NULL DEFAULT '{}';
    UPDATE buffers AS b SET pending = p.calls
        FROM (SELECT buffer_id,
                     json_object_agg(call_id, json_build_array(turn_pos, ord))::text AS calls
              FROM pending GROUP BY buffer_id) AS p
        WHERE b.id = p.buffer_id;
    DROP TABLE pending;
    """,
)
"""Schema migrations, in order; ``schema_version`` records each one applied.

``buffers`` has a low fill factor because every append updates its row: the
updates stay HOT (no indexed column changes) and the row's page has room.
"""

_VERSION_TABLE: Final = """
    CREATE TABLE IF NOT EXISTS schema_version (
        version INTEGER PRIMARY KEY,
        applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )
"""


def quoted_schema(name: str) -> str:
    """``name`` as a quoted identifier, after checking it is a schema name flowmem accepts."""
    if not SCHEMA_NAME.fullmatch(name):
        raise InvalidStoreURL(f"schema must match {SCHEMA_NAME.pattern}, got {name!r}")
    return f'"{name}"'


def _lock_of(schema: str) -> int:
    digest = hashlib.blake2b(schema.encode("ascii"), digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True)


def stored_version(cur: Cursor[tuple[Any, ...]], schema: str) -> int:
    """The version ``schema`` is at (0: not created yet)."""
    table = cur.execute("SELECT to_regclass(%s)::text",
                        (f"{quoted_schema(schema)}.schema_version",)).fetchone()
    if table is None or table[0] is None:
        return 0
    row = cur.execute(f"SELECT coalesce(max(version), 0) FROM {quoted_schema(schema)}"
                      ".schema_version").fetchone()
    return int(row[0]) if row else 0


def _check_version(version: int, schema: str) -> None:
    if version > len(MIGRATIONS):
        raise SchemaError(f"schema {schema!r} is at version {version}; this flowmem knows "
                          f"{len(MIGRATIONS)} — upgrade flowmem")


def migrate(cur: Cursor[tuple[Any, ...]], schema: str) -> int:
    """Bring ``schema`` up to date through ``cur`` (an autocommit connection's cursor).

    Returns the version. Raises :class:`~flowmem.errors.SchemaError` when the
    schema is newer than this flowmem.
    """
    ident = quoted_schema(schema)
    version = stored_version(cur, schema)
    _check_version(version, schema)
    if version == len(MIGRATIONS):
        return version
    cur.execute("BEGIN")
    try:
        cur.execute(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK_CLASS}, {_lock_of(schema)})")
        if cur.execute("SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %s",
                       (schema,)).fetchone() is None:
            cur.execute(f"CREATE SCHEMA {ident}")
        cur.execute(f"SET LOCAL search_path TO {ident}")
        cur.execute(_VERSION_TABLE)
        version = stored_version(cur, schema)
        _check_version(version, schema)
        for number in range(version, len(MIGRATIONS)):
            cur.execute(MIGRATIONS[number])
            cur.execute("INSERT INTO schema_version (version) VALUES (%s)", (number + 1,))
        cur.execute("COMMIT")
    except BaseException:
        if cur.connection.info.transaction_status != TransactionStatus.IDLE:
            with suppress(Exception):  # the original error is the one to report
                cur.execute("ROLLBACK")
        raise
    return len(MIGRATIONS)
