"""The SQLite schema of flowmem: versioned migrations, run under the setup lock.

The tables are those of :mod:`flowmem.stores.sql`. ``PRAGMA user_version``
is the number of migrations applied. :func:`migrate` is safe to repeat: a
read of the version returns when the schema is current; otherwise the work
runs in one ``BEGIN IMMEDIATE`` transaction that re-reads the version (the
SQLite store also runs it under the setup lock of its lock file, so
processes opening one database at once take turns).
"""

from __future__ import annotations

import sqlite3
from typing import Final

from ..errors import SchemaError, StoreError
from .sql_program import encode

__all__ = ["MIGRATIONS", "MIN_SQLITE_VERSION", "check_library", "check_version", "migrate",
           "user_version"]

MIN_SQLITE_VERSION: Final = (3, 35, 0)  # UPSERT on a partial index + RETURNING

MIGRATIONS: Final[tuple[str, ...]] = (
    """
    CREATE TABLE kv (
        scope TEXT NOT NULL, scope_id TEXT NOT NULL, key TEXT NOT NULL,
        value TEXT NOT NULL,
        PRIMARY KEY (scope, scope_id, key)
    ) WITHOUT ROWID;
    CREATE TABLE buffers (
        id INTEGER PRIMARY KEY,
        scope TEXT NOT NULL, scope_id TEXT NOT NULL, key TEXT NOT NULL,
        count INTEGER NOT NULL DEFAULT 0,
        next_pos INTEGER NOT NULL DEFAULT 0,
        UNIQUE (scope, scope_id, key)
    );
    CREATE TABLE messages (
        buffer_id INTEGER NOT NULL,
        pos INTEGER NOT NULL,
        role TEXT NOT NULL,
        result_id TEXT,
        healed INTEGER NOT NULL DEFAULT 0,
        body TEXT NOT NULL,
        UNIQUE (buffer_id, pos)
    );
    CREATE UNIQUE INDEX messages_result ON messages (buffer_id, result_id)
        WHERE result_id IS NOT NULL;
    CREATE TABLE calls (
        buffer_id INTEGER NOT NULL, call_id TEXT NOT NULL,
        turn_pos INTEGER NOT NULL, ord INTEGER NOT NULL,
        PRIMARY KEY (buffer_id, call_id, turn_pos)
    ) WITHOUT ROWID;
    CREATE INDEX calls_turn ON calls (buffer_id, turn_pos);
    CREATE TABLE pending (
        buffer_id INTEGER NOT NULL, call_id TEXT NOT NULL,
        turn_pos INTEGER NOT NULL, ord INTEGER NOT NULL,
        PRIMARY KEY (buffer_id, call_id)
    ) WITHOUT ROWID;
    """,
    """
    CREATE TABLE idempotency (
        ikey TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, outcome TEXT,
        expires REAL NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX idempotency_expires ON idempotency (expires);
    """,
    # 3: the hot path (#14). Messages are clustered by (buffer, position) in one
    # b-tree (no rowid table beside a unique index: one page less per append);
    # calls lose their turn index: only the window scans calls by turn, and a
    # windowed buffer holds at most its window.
    """
    CREATE TABLE messages_by_position (
        buffer_id INTEGER NOT NULL,
        pos INTEGER NOT NULL,
        role TEXT NOT NULL,
        result_id TEXT,
        healed INTEGER NOT NULL DEFAULT 0,
        body TEXT NOT NULL,
        PRIMARY KEY (buffer_id, pos)
    ) WITHOUT ROWID;
    INSERT INTO messages_by_position (buffer_id, pos, role, result_id, healed, body)
        SELECT buffer_id, pos, role, result_id, healed, body FROM messages;
    DROP TABLE messages;
    ALTER TABLE messages_by_position RENAME TO messages;
    CREATE UNIQUE INDEX messages_result ON messages (buffer_id, result_id)
        WHERE result_id IS NOT NULL;
    DROP INDEX calls_turn;
    """,
    # 4: the unanswered calls move into their buffer's row (a JSON object
    # {call id: [turn position, order]}, :class:`~flowmem.stores.sql_apply.PendingInRow`):
    # the row is written by every append anyway, so opening or answering a call
    # costs no statement and no page of its own. The rows move in _pending_into_rows.
    """
    ALTER TABLE buffers ADD COLUMN pending TEXT NOT NULL DEFAULT '{}';
    """,
    # 5: a version per buffer, so a connection's copy of a buffer (stores/sqlite_hot.py)
    # is checked against its own buffer's row, not dropped by any commit to the file.
    # flowmem's appends set a new random version; the trigger (_versioned_rows) gives one
    # to any other change of a row that leaves the version as it was — an edit, or a
    # writer of an older flowmem still running on the file.
    """
    ALTER TABLE buffers ADD COLUMN version INTEGER NOT NULL DEFAULT 0;
    """,
    # 6: the placeholders (MEM-3) by buffer, so that filling a connection's copy of a
    # buffer (stores/sqlite_programs.py) reads two indexes, never the messages' bodies.
    # Only placeholders are in it: an append of anything else writes no entry.
    """
    CREATE INDEX messages_healed ON messages (buffer_id, result_id) WHERE healed = 1;
    """,
    # 7: a buffer's state (count, next position, unanswered calls, version) rides on its
    # newest entry (stores/sqlite_head.py): the common append writes no row of `buffers`,
    # one statement and one page less. The row keeps an empty buffer's state; its count
    # goes, so a writer of an older flowmem still running on the file fails (its
    # statements name the column) instead of saving a state nobody reads.
    """
    ALTER TABLE messages ADD COLUMN head_count INTEGER;
    ALTER TABLE messages ADD COLUMN head_next INTEGER;
    ALTER TABLE messages ADD COLUMN head_pending TEXT;
    ALTER TABLE messages ADD COLUMN head_version INTEGER;
    UPDATE messages SET head_count = b.count, head_next = b.next_pos,
        head_pending = b.pending, head_version = b.version
        FROM buffers AS b WHERE messages.buffer_id = b.id
        AND messages.pos = (SELECT max(pos) FROM messages AS m WHERE m.buffer_id = b.id);
    ALTER TABLE buffers DROP COLUMN count;
    """,
    # 8: a declaration waits for its answer (stores/sql_declarations.py): a call a turn
    # opens as unanswered is kept in the state, then on the entry that answers it
    # (declared_at, declared_ord), not in `calls`: a declaring turn writes one row, not a
    # random leaf of the calls' key per id. The results that carry no declaration
    # (orphans; every result stored before schema 8) join the placeholders in ONE partial
    # index (a second one costs every INSERT its check), so a fill reads the declared
    # answers without a body. `declarations` is every declaration by turn. head_pending is
    # renamed, so that a writer of an older flowmem still running on the file fails (every
    # append of it names the column) instead of answering a call whose declaration it
    # cannot see.
    """
    ALTER TABLE messages RENAME COLUMN head_pending TO head_unanswered;
    ALTER TABLE messages ADD COLUMN declared_at INTEGER;
    ALTER TABLE messages ADD COLUMN declared_ord INTEGER;
    DROP INDEX messages_healed;
    CREATE INDEX messages_marked ON messages (buffer_id, result_id, healed, declared_at)
        WHERE healed = 1 OR (result_id IS NOT NULL AND declared_at IS NULL);
    CREATE VIEW declarations (buffer_id, call_id, turn_pos, ord) AS
        SELECT buffer_id, call_id, turn_pos, ord FROM calls
        UNION ALL SELECT buffer_id, result_id, declared_at, declared_ord FROM messages
        WHERE declared_at IS NOT NULL;
    """,
    # 9: messages back in a rowid table, in the order they were written, beside a unique
    # index of (buffer, position). Clustered by (buffer, position) (schema 3) a row, its
    # body and state included, lands in the middle of the b-tree whenever other
    # conversations were written after its own, and a leaf of such rows fills in a few
    # appends and splits: in a file many conversations share (a service's), 2.99 pages a
    # commit against 2.22, about 4,600 instructions an append more (one conversation
    # alone: 2.19 against 2.30, 1,900 fewer; docs/benchmarks-hotpath.md, twelfth pass).
    # A new row's id is the largest plus one, so it goes to the table's last leaf; the
    # position index's entries are small, so its leaves split rarely.
    """
    DROP VIEW declarations;
    CREATE TABLE messages_by_row (
        id INTEGER PRIMARY KEY,
        buffer_id INTEGER NOT NULL,
        pos INTEGER NOT NULL,
        role TEXT NOT NULL,
        result_id TEXT,
        healed INTEGER NOT NULL DEFAULT 0,
        body TEXT NOT NULL,
        head_count INTEGER,
        head_next INTEGER,
        head_unanswered TEXT,
        head_version INTEGER,
        declared_at INTEGER,
        declared_ord INTEGER
    );
    INSERT INTO messages_by_row (buffer_id, pos, role, result_id, healed, body, head_count,
        head_next, head_unanswered, head_version, declared_at, declared_ord)
        SELECT buffer_id, pos, role, result_id, healed, body, head_count, head_next,
        head_unanswered, head_version, declared_at, declared_ord FROM messages
        ORDER BY buffer_id, pos;
    DROP TABLE messages;
    ALTER TABLE messages_by_row RENAME TO messages;
    CREATE UNIQUE INDEX messages_position ON messages (buffer_id, pos);
    CREATE UNIQUE INDEX messages_result ON messages (buffer_id, result_id)
        WHERE result_id IS NOT NULL;
    CREATE INDEX messages_marked ON messages (buffer_id, result_id, healed, declared_at)
        WHERE healed = 1 OR (result_id IS NOT NULL AND declared_at IS NULL);
    CREATE VIEW declarations (buffer_id, call_id, turn_pos, ord) AS
        SELECT buffer_id, call_id, turn_pos, ord FROM calls
        UNION ALL SELECT buffer_id, result_id, declared_at, declared_ord FROM messages
        WHERE declared_at IS NOT NULL;
    """,
)
"""Schema migrations; ``PRAGMA user_version`` is the number applied."""


def _pending_into_rows(conn: sqlite3.Connection) -> None:
    """Migration 4's data: each buffer's ``pending`` rows into its row; the table goes."""
    calls: dict[int, dict[str, list[int]]] = {}
    for buffer_id, call, turn, order in conn.execute(
            "SELECT buffer_id, call_id, turn_pos, ord FROM pending"):
        calls.setdefault(int(buffer_id), {})[call] = [int(turn), int(order)]
    conn.executemany("UPDATE buffers SET pending = ? WHERE id = ?",
                     [(encode(held), buffer_id) for buffer_id, held in calls.items()])
    conn.execute("DROP TABLE pending")


def _versioned_rows(conn: sqlite3.Connection) -> None:
    """Migration 5's trigger (one statement: its body holds a ``;``)."""
    conn.execute("CREATE TRIGGER buffers_version AFTER UPDATE ON buffers "
                 "WHEN NEW.version = OLD.version "
                 "BEGIN UPDATE buffers SET version = random() WHERE id = NEW.id; END")


_AFTER: Final = {3: _pending_into_rows, 4: _versioned_rows}
"""Python steps run after the SQL of a migration (by index in :data:`MIGRATIONS`)."""


def check_library() -> None:
    """Refuse an SQLite library older than :data:`MIN_SQLITE_VERSION`."""
    if sqlite3.sqlite_version_info < MIN_SQLITE_VERSION:
        wanted = ".".join(map(str, MIN_SQLITE_VERSION))
        raise StoreError(f"SQLite {sqlite3.sqlite_version} is too old; flowmem needs {wanted}+")


def user_version(conn: sqlite3.Connection) -> int:
    """The number of migrations applied to the database ``conn`` has open."""
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def check_version(version: int, path: str, *, read_only: bool = False) -> None:
    """Refuse a schema newer than this flowmem (or, read-only, an unmigrated one)."""
    if version > len(MIGRATIONS):
        raise SchemaError(f"{path} has schema version {version}; this flowmem "
                          f"knows {len(MIGRATIONS)} — upgrade flowmem")
    if read_only and version < len(MIGRATIONS):
        raise SchemaError(f"{path} has schema version {version}; this flowmem needs "
                          f"{len(MIGRATIONS)}: open it once read-write to migrate it")


def migrate(conn: sqlite3.Connection, path: str) -> None:
    """Bring the schema of the database ``conn`` has open up to date."""
    version = user_version(conn)
    check_version(version, path)
    if version == len(MIGRATIONS):
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = user_version(conn)  # another program may have migrated it meanwhile
        for number in range(version, len(MIGRATIONS)):
            for statement in MIGRATIONS[number].split(";"):
                if statement.strip():
                    conn.execute(statement)
            if number in _AFTER:
                _AFTER[number](conn)
        conn.execute(f"PRAGMA user_version = {len(MIGRATIONS)}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
