"""The PostgreSQL schema of flowmem: one baseline, its marker, and the setup that makes it.

The tables are those of :mod:`flowmem.stores.sql._conversations` (the SQLite ones, typed for
PostgreSQL): ``BIGINT`` positions, ``healed`` an integer, and every key or id
column ``COLLATE "C"`` so keys sort by code point exactly as on SQLite. They
live in one dedicated schema (``flowmem`` unless the URL says otherwise).

The distribution key: every table a conversation touches leads its primary
key with the conversation's key, :func:`flowmem.scopes.conversation_key`
of (scope, scope id, key), computed by the client. ``buffers.id`` IS that key
(no identity column), so ``messages``, ``calls`` and ``idempotency`` lead with
``buffer_id``; a plain value's row (``kv.id``) is keyed by the key of its
storage key the same way. The names are kept beside the key and every
statement checks them, so a collision of two keys is an error
(:class:`~flowmem.errors.StoreError`), never a shared conversation. Every
statement of a single-conversation operation names the key, so it is
routable to one shard (Citus: ``docs/deploy.md``), and with ``?partitions=N``
each table is ``PARTITION BY HASH`` of it, in ``N`` partitions, chosen when
the schema is created.

The schema is marked by ``flowmem_schema`` (one row: the baseline's number
and the partitions); later releases add named migrations, recorded in
``flowmem_migrations``. A schema of flowmem's tables without the marker was
written by an unreleased earlier build: refused with one
:class:`~flowmem.errors.SchemaError` saying how to move its data.

:func:`migrate` is safe to repeat and safe to run from many processes at
once: a quick read of the marker returns when the schema is current;
otherwise the work runs in one transaction holding a transaction-level
advisory lock (two-key form, so it never collides with the MEM-12 locks),
reads the marker again and does only what is missing.
"""

from __future__ import annotations

import hashlib
import re
from contextlib import suppress
from typing import Any, Final

from psycopg import Cursor
from psycopg.pq import TransactionStatus

from ...errors import InvalidStoreURL, SchemaError

__all__ = [
    "BASELINE",
    "DISTRIBUTION",
    "MAX_PARTITIONS",
    "MIGRATIONS",
    "SCHEMA_NAME",
    "baseline_statements",
    "current",
    "migrate",
    "quoted_schema",
    "stored_state",
]

SCHEMA_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
"""A schema name flowmem accepts (an unquoted-style identifier, any case)."""

BASELINE: Final = 2
"""The baseline this flowmem creates (flowmem 0.2.0's schema; unreleased builds wrote 1)."""
MAX_PARTITIONS: Final = 1024

_MIGRATION_LOCK_CLASS: Final = 0x466D656D  # "Fmem": first key of the two-key advisory lock
_C: Final = 'TEXT COLLATE "C" NOT NULL'
_NAMES: Final = f"scope {_C}, scope_id {_C}, key {_C}"

MIGRATIONS: Final[tuple[tuple[str, str], ...]] = ()
"""The named migrations after the baseline, in order: ``(name, SQL)``. None yet."""

_TABLES: Final[tuple[tuple[str, str, str, str], ...]] = (
    # (table, columns and key, distribution column, storage options of its partitions)
    ("kv", f"id BIGINT NOT NULL, {_NAMES}, value TEXT NOT NULL, "
     "expires_at DOUBLE PRECISION, PRIMARY KEY (id)", "id", ""),
    # every append updates a buffer's row: a low fill factor keeps those updates HOT
    ("buffers", f"id BIGINT NOT NULL, {_NAMES}, count BIGINT NOT NULL DEFAULT 0, "
     "next_pos BIGINT NOT NULL DEFAULT 0, pending TEXT NOT NULL DEFAULT '{}', "
     "expires_at DOUBLE PRECISION, PRIMARY KEY (id)", "id", " WITH (fillfactor = 50)"),
    ("messages", f"buffer_id BIGINT NOT NULL, pos BIGINT NOT NULL, role {_C}, "
     'result_id TEXT COLLATE "C", healed INTEGER NOT NULL DEFAULT 0, body TEXT NOT NULL, '
     "PRIMARY KEY (buffer_id, pos)", "buffer_id", ""),
    ("calls", f"buffer_id BIGINT NOT NULL, call_id {_C}, turn_pos BIGINT NOT NULL, "
     "ord INTEGER NOT NULL, PRIMARY KEY (buffer_id, call_id, turn_pos)", "buffer_id", ""),
    # an idempotency key is recorded with the conversation its operation changes
    ("idempotency", f"buffer_id BIGINT NOT NULL, ikey {_C}, fingerprint TEXT NOT NULL, "
     "outcome TEXT, expires DOUBLE PRECISION NOT NULL, PRIMARY KEY (buffer_id, ikey)",
     "buffer_id", ""),
    # an identity scope id under erasure (stores/sql/_erasure.py), keyed by its scope id's key
    ("erasures", f"id BIGINT NOT NULL, scope {_C}, scope_id {_C}, PRIMARY KEY (id)", "id", ""),
)
DISTRIBUTION: Final = {table: column for table, _, column, _ in _TABLES}
"""Each table's distribution column (the conversation key)."""
_INDEXES: Final = (
    "CREATE INDEX kv_names ON kv (scope, scope_id, key)",  # key listing (a fan-out)
    "CREATE INDEX buffers_names ON buffers (scope, scope_id, key)",
    "CREATE UNIQUE INDEX messages_result ON messages (buffer_id, result_id) "
    "WHERE result_id IS NOT NULL",
    "CREATE INDEX calls_turn ON calls (buffer_id, turn_pos)",
    # retention: the sweep finds expired rows by these (kept NULL, so unindexed, without it)
    "CREATE INDEX kv_expires ON kv (expires_at) WHERE expires_at IS NOT NULL",
    "CREATE INDEX buffers_expires ON buffers (expires_at) WHERE expires_at IS NOT NULL",
)
_MARKER: Final = """
    CREATE TABLE flowmem_schema (
        single BOOLEAN PRIMARY KEY DEFAULT true CHECK (single),
        baseline INTEGER NOT NULL,
        partitions INTEGER NOT NULL,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now()
    );
    CREATE TABLE flowmem_migrations (
        name TEXT COLLATE "C" PRIMARY KEY,
        applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )
"""
_EARLIER: Final = ("schema_version", "buffers", "messages", "kv", "calls", "idempotency",
                   "pending")
"""Tables whose presence without the marker means an earlier build wrote the schema."""


def quoted_schema(name: str) -> str:
    """``name`` as a quoted identifier, after checking it is a schema name flowmem accepts."""
    if not SCHEMA_NAME.fullmatch(name):
        raise InvalidStoreURL(f"schema must match {SCHEMA_NAME.pattern}, got {name!r}")
    return f'"{name}"'


def baseline_statements(partitions: int) -> list[str]:
    """The DDL of the baseline (in the schema on the search path), each table hash
    partitioned by its conversation key in ``partitions`` partitions (0: not partitioned)."""
    statements = [_MARKER]
    for table, columns, column, storage in _TABLES:
        if partitions:
            statements.append(f"CREATE TABLE {table} ({columns}) PARTITION BY HASH ({column})")
            statements += [f"CREATE TABLE {table}_p{number} PARTITION OF {table} "
                           f"FOR VALUES WITH (MODULUS {partitions}, REMAINDER {number})"
                           f"{storage}" for number in range(partitions)]
        else:
            statements.append(f"CREATE TABLE {table} ({columns}){storage}")
    statements += _INDEXES
    statements.append(f"INSERT INTO flowmem_schema (baseline, partitions) "
                      f"VALUES ({BASELINE}, {partitions})")
    return statements


def _lock_of(schema: str) -> int:
    digest = hashlib.blake2b(schema.encode("ascii"), digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True)


def stored_state(cur: Cursor[tuple[Any, ...]],
                 schema: str) -> tuple[int, int, frozenset[str]] | None:
    """``(baseline, partitions, applied migrations)`` of ``schema``; ``None`` when it has
    no marker (not created yet, or written by an earlier build: :func:`check_earlier`)."""
    ident = quoted_schema(schema)
    found = cur.execute("SELECT to_regclass(%s)::text",
                        (f"{ident}.flowmem_schema",)).fetchone()
    if found is None or found[0] is None:
        return None
    row = cur.execute(f"SELECT baseline, partitions FROM {ident}.flowmem_schema").fetchone()
    if row is None:
        raise SchemaError(f"schema {schema!r} has an empty flowmem_schema marker; it was "
                          "not made by flowmem")
    applied = cur.execute(f"SELECT name FROM {ident}.flowmem_migrations").fetchall()
    return int(row[0]), int(row[1]), frozenset(name for name, in applied)


def _check_earlier(cur: Cursor[tuple[Any, ...]], schema: str) -> None:
    """Refuse a schema that holds flowmem's tables but no marker (an unreleased earlier
    build wrote it: its tables have another shape)."""
    found = [table for table in _EARLIER if cur.execute(
        "SELECT to_regclass(%s)", (f"{quoted_schema(schema)}.{table}",)).fetchone() != (None,)]
    if found:
        raise SchemaError(
            f"schema {schema!r} was written by an earlier, unreleased build of flowmem (it "
            f"has the tables {', '.join(found)} but no flowmem_schema marker); this flowmem "
            f"cannot use it. To move its data: open it with the build that wrote it and run "
            f"`flowmem export --store <its URL> --scope <scope> ... -o data.jsonl` (for each "
            f"scope), then with this flowmem `flowmem import --store <a URL naming a new "
            f"?schema=...> data.jsonl`")


def _check(state: tuple[int, int, frozenset[str]], schema: str,
           partitions: int | None) -> None:
    baseline, stored_partitions, applied = state
    known = {name for name, _ in MIGRATIONS}
    if baseline > BASELINE or applied - known:
        newer = sorted(applied - known)
        raise SchemaError(f"schema {schema!r} is at baseline {baseline}"
                          + (f" with migrations {newer}" if newer else "")
                          + f"; this flowmem knows baseline {BASELINE} and "
                          f"{len(known)} migrations — upgrade flowmem")
    if baseline < BASELINE:
        raise SchemaError(f"schema {schema!r} is at baseline {baseline}, older than this "
                          f"flowmem's {BASELINE}; move its data with `flowmem export` and "
                          f"`flowmem import`")
    if partitions is not None and partitions != stored_partitions:
        raise SchemaError(f"schema {schema!r} was created with partitions="
                          f"{stored_partitions}; the URL asks for partitions={partitions} "
                          "(the number is chosen once, when the schema is created)")


def current(state: tuple[int, int, frozenset[str]] | None) -> bool:
    """Whether a schema in ``state`` needs no work from :func:`migrate`."""
    return state is not None and state[0] == BASELINE and all(
        name in state[2] for name, _ in MIGRATIONS)


def migrate(cur: Cursor[tuple[Any, ...]], schema: str, partitions: int | None = None) -> int:
    """Create ``schema`` at the baseline, or bring it up to date, through ``cur`` (an
    autocommit connection's cursor); returns its number of partitions.

    ``partitions``: what the URL asks for (``None``: whatever the schema has; a new
    schema then gets none). Raises :class:`~flowmem.errors.SchemaError` for a schema
    of an earlier build, of a newer flowmem, or created with other partitions.
    """
    ident = quoted_schema(schema)
    state = stored_state(cur, schema)
    if state is not None:
        _check(state, schema, partitions)
        if current(state):
            return state[1]
    # An earlier build's tables are looked for under the lock only: out of it, another
    # process may commit the whole baseline between this one's two looks.
    cur.execute("BEGIN")
    try:
        cur.execute(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK_CLASS}, {_lock_of(schema)})")
        if cur.execute("SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %s",
                       (schema,)).fetchone() is None:
            cur.execute(f"CREATE SCHEMA {ident}")
        cur.execute(f"SET LOCAL search_path TO {ident}")
        state = stored_state(cur, schema)
        if state is None:
            _check_earlier(cur, schema)
            for statement in baseline_statements(partitions or 0):
                cur.execute(statement)
            state = (BASELINE, partitions or 0, frozenset())
        _check(state, schema, partitions)
        for name, sql in MIGRATIONS:
            if name not in state[2]:
                cur.execute(sql)
                cur.execute("INSERT INTO flowmem_migrations (name) VALUES (%s)", (name,))
        cur.execute("COMMIT")
    except BaseException:
        if cur.connection.info.transaction_status != TransactionStatus.IDLE:
            with suppress(Exception):  # the original error is the one to report
                cur.execute("ROLLBACK")
        raise
    return state[1]
