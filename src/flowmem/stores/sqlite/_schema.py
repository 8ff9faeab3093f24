"""The SQLite schema of flowmem: one baseline, created once, marked, checked at every open.

The tables are those of :mod:`flowmem.stores.sql._conversations` (the state of a
conversation rides on its newest entry: :mod:`._state`). A database flowmem creates
gets :data:`BASELINE` in one ``BEGIN IMMEDIATE`` transaction, and is marked
``PRAGMA application_id`` = :data:`APPLICATION_ID` ("this is a flowmem database") and
``PRAGMA user_version`` = :data:`SCHEMA_VERSION`. The SQLite store creates it under
the setup lock of its lock file, so processes opening one new database at once take
turns; the transaction re-reads the marker anyway.

There are no migrations. What :func:`prepare` does with a file:

* empty (no table, no marker): gets the baseline (read-only: refused);
* marked, at :data:`SCHEMA_VERSION`: used as it is;
* marked, version 10: written by an unreleased earlier build of this baseline:
  refused as below;
* marked, another version: written by a newer (or unknown) flowmem: refused;
* unmarked, ``user_version`` 1 to 9 and flowmem's tables: written by an unreleased
  earlier build (its migrations numbered the schema 1 to 9): refused, the error says
  how to move its data (``flowmem export`` with that build, ``flowmem import`` with
  this one); the file is left as it was;
* anything else (another program's database): refused.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Final

from ...errors import SchemaError, StoreError

__all__ = ["APPLICATION_ID", "BASELINE", "MIN_SQLITE_VERSION", "SCHEMA_VERSION", "check",
           "check_header", "check_library", "prepare"]

MIN_SQLITE_VERSION: Final = (3, 35, 0)  # UPSERT on a partial index + RETURNING

APPLICATION_ID: Final = 0x666C6D65
"""``PRAGMA application_id`` of a flowmem database (``"flme"``)."""
SCHEMA_VERSION: Final = 11
"""``PRAGMA user_version`` of this baseline (the unreleased builds before it used 1 to 10)."""
_EARLIER_BUILDS: Final = range(1, SCHEMA_VERSION)
_EARLIER_MARKED: Final = range(10, SCHEMA_VERSION)
"""Versions an unreleased build marked as flowmem's before the baseline took its last shape."""

BASELINE: Final = f"""
CREATE TABLE kv (
    scope TEXT NOT NULL, scope_id TEXT NOT NULL, key TEXT NOT NULL,
    value TEXT NOT NULL,
    expires_at REAL,
    PRIMARY KEY (scope, scope_id, key)
) WITHOUT ROWID;
CREATE INDEX kv_expires ON kv (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE buffers (
    id INTEGER PRIMARY KEY,
    scope TEXT NOT NULL, scope_id TEXT NOT NULL, key TEXT NOT NULL,
    next_pos INTEGER NOT NULL DEFAULT 0,
    pending TEXT NOT NULL DEFAULT '{{}}',
    version INTEGER NOT NULL DEFAULT 0,
    expires_at REAL,
    UNIQUE (scope, scope_id, key)
);
CREATE INDEX buffers_expires ON buffers (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE messages (
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
CREATE UNIQUE INDEX messages_position ON messages (buffer_id, pos);
CREATE UNIQUE INDEX messages_result ON messages (buffer_id, result_id)
    WHERE result_id IS NOT NULL;
CREATE TABLE calls (
    buffer_id INTEGER NOT NULL, call_id TEXT NOT NULL,
    turn_pos INTEGER NOT NULL, ord INTEGER NOT NULL,
    PRIMARY KEY (buffer_id, call_id, turn_pos)
) WITHOUT ROWID;
CREATE VIEW declarations (buffer_id, call_id, turn_pos, ord) AS
    SELECT buffer_id, call_id, turn_pos, ord FROM calls
    UNION ALL SELECT buffer_id, result_id, declared_at, declared_ord FROM messages
    WHERE declared_at IS NOT NULL;
CREATE TABLE idempotency (
    ikey TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, outcome TEXT,
    expires REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX idempotency_expires ON idempotency (expires);
CREATE TABLE erasures (
    scope TEXT NOT NULL, scope_id TEXT NOT NULL,
    PRIMARY KEY (scope, scope_id)
) WITHOUT ROWID;
CREATE TRIGGER buffers_version AFTER UPDATE OF next_pos, pending, version ON buffers
    WHEN NEW.version = OLD.version
    BEGIN UPDATE buffers SET version = random() WHERE id = NEW.id; END;
PRAGMA application_id = {APPLICATION_ID};
PRAGMA user_version = {SCHEMA_VERSION};
"""
"""The whole schema (``executescript``). Messages: a rowid table in the order they were
written, beside a unique (buffer, position) index; a buffer's state on its newest entry
(:mod:`._state`), the row keeping an empty buffer's; a declaration waits for its answer
(``declared_at``/``declared_ord``; :mod:`flowmem.stores.sql._declarations`), the
``declarations`` view is every declaration by turn (the window reads it); the trigger
gives a buffer's state a new version when an ``UPDATE`` leaves it as it was (setting
``expires_at`` is no change of its state). ``expires_at``: when the row expires (retention,
:mod:`flowmem.stores.sql._expiry`), indexed for the sweep."""

_MARKER: Final = ("SELECT (SELECT application_id FROM pragma_application_id), "
                  "(SELECT user_version FROM pragma_user_version), "
                  "(SELECT count(*) FROM sqlite_schema), "
                  "(SELECT count(*) FROM sqlite_schema WHERE type = 'table' "
                  "AND name IN ('kv', 'buffers', 'messages'))")


def check_library() -> None:
    """Refuse an SQLite library older than :data:`MIN_SQLITE_VERSION`."""
    if sqlite3.sqlite_version_info < MIN_SQLITE_VERSION:
        wanted = ".".join(map(str, MIN_SQLITE_VERSION))
        raise StoreError(f"SQLite {sqlite3.sqlite_version} is too old; flowmem needs {wanted}+")


def check(conn: sqlite3.Connection, path: str, *, read_only: bool = False) -> bool:
    """Whether the database has this baseline (``False``: it is empty, to be created);
    raises :class:`SchemaError` for any file this build must not use (module notes). Run
    on every new connection before anything is written (WAL mode included), so a refused
    file is left byte for byte as it was."""
    try:
        application, version, objects, ours = conn.execute(_MARKER).fetchone()
    except sqlite3.DatabaseError as exc:  # "file is not a database", "... is encrypted"
        raise SchemaError(f"{path} is not a SQLite database ({exc}): flowmem leaves it "
                          f"alone") from None
    if application == APPLICATION_ID:
        if version == SCHEMA_VERSION:
            return True
        if version in _EARLIER_MARKED:
            raise _earlier_build(path, version)
        raise SchemaError(
            f"{path} is a flowmem database of schema version {version}; this flowmem knows "
            f"only {SCHEMA_VERSION}: open it with the flowmem that wrote it (a newer one)")
    if application == 0 and version in _EARLIER_BUILDS and ours == 3:
        raise _earlier_build(path, version)
    if application == 0 and version == 0 and objects == 0:
        if read_only:
            raise SchemaError(f"{path} is empty (no flowmem schema): a read-only store never "
                              f"creates it; open it once read-write")
        return False
    raise SchemaError(f"{path} is not a flowmem database (application_id {application}, "
                      f"user_version {version}, {objects} schema objects): flowmem leaves it "
                      f"alone")


def _earlier_build(path: str, version: int) -> SchemaError:
    return SchemaError(
        f"{path} was written by an unreleased earlier build of flowmem (schema version "
        f"{version}); this build reads only its own schema ({SCHEMA_VERSION}) and left "
        f"the file unchanged. To move its data: open it with the build that wrote it and "
        f"run `flowmem export`, then `flowmem import` the export into a new database "
        f"file with this build")


_HEADER: Final = b"SQLite format 3\x00"


def check_header(path: str) -> None:
    """Refuse, from the file's first 100 bytes alone and before anything is created beside
    it (no ``.lock``, no ``-wal``), a file flowmem must not open: one that is not a SQLite
    database, or another application's (an ``application_id`` not flowmem's, or none and
    more than one page without an earlier build's ``user_version``). A file with a
    ``-wal`` beside it is left to :func:`check` (its header may not be current); a
    missing or empty file passes (it is created or gets the baseline)."""
    try:
        with open(path, "rb") as file:
            header = file.read(100)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not header:
        return
    if not header.startswith(_HEADER) or len(header) < 100:
        raise SchemaError(f"{path} is not a SQLite database (its first bytes are not a "
                          f"SQLite header): flowmem leaves it alone")
    try:
        if os.path.getsize(path + "-wal") > 0:
            return
    except OSError:
        pass
    version = int.from_bytes(header[60:64], "big")
    application = int.from_bytes(header[68:72], "big")
    pages = int.from_bytes(header[28:32], "big")
    if application in (0, APPLICATION_ID) and (application or version or pages <= 1):
        return  # flowmem's, an earlier build's, or empty: check() decides on the schema
    raise SchemaError(f"{path} is not a flowmem database (application_id {application}, "
                      f"user_version {version}, {pages} pages): flowmem leaves it alone")


def prepare(conn: sqlite3.Connection, path: str, *, read_only: bool = False) -> None:
    """Check the schema of the database ``conn`` has open, creating the baseline in an
    empty one (see the module notes); safe to repeat and to race."""
    if check(conn, path, read_only=read_only):
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        if not check(conn, path, read_only=False):  # nobody created it meanwhile
            for statement in _statements(BASELINE):
                conn.execute(statement)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _statements(script: str) -> list[str]:
    """The statements of ``script`` (``sqlite3.complete_statement`` keeps a trigger's
    body, which holds a ``;``, whole)."""
    statements: list[str] = []
    current = ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            statements.append(current.strip())
            current = ""
    assert not current.strip(), "an unfinished statement in the baseline"
    return statements
