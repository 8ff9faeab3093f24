"""One baseline schema (stores/sqlite/_schema.py): a new file gets it, marked; a file of an
unreleased earlier build, of a newer flowmem or of another program is refused and left
exactly as it was."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from flowmem.errors import SchemaError
from flowmem.scopes import StorageKey
from flowmem.stores.sqlite._schema import APPLICATION_ID, SCHEMA_VERSION
from flowmem.stores.sqlite._store import SQLiteStore

KEY = StorageKey("session", "s1", "chat")

# what the unreleased builds before the baseline created (their migration 1): flowmem's
# three tables, unmarked, user_version = the number of migrations they had applied
_EARLIER_BUILD: str = """
CREATE TABLE kv (scope TEXT NOT NULL, scope_id TEXT NOT NULL, key TEXT NOT NULL,
    value TEXT NOT NULL, PRIMARY KEY (scope, scope_id, key)) WITHOUT ROWID;
CREATE TABLE buffers (id INTEGER PRIMARY KEY, scope TEXT NOT NULL, scope_id TEXT NOT NULL,
    key TEXT NOT NULL, count INTEGER NOT NULL DEFAULT 0,
    next_pos INTEGER NOT NULL DEFAULT 0, UNIQUE (scope, scope_id, key));
CREATE TABLE messages (buffer_id INTEGER NOT NULL, pos INTEGER NOT NULL,
    role TEXT NOT NULL, result_id TEXT, healed INTEGER NOT NULL DEFAULT 0,
    body TEXT NOT NULL, UNIQUE (buffer_id, pos));
INSERT INTO buffers (scope, scope_id, key, count, next_pos) VALUES ('session', 's1', 'chat',
    1, 2097152);
INSERT INTO messages VALUES (1, 1048576, 'user', NULL, 0, '{"role":"user","content":"hi"}');
"""


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _marker(path: Path) -> tuple[int, int]:
    with sqlite3.connect(path) as conn:
        return (conn.execute("PRAGMA application_id").fetchone()[0],
                conn.execute("PRAGMA user_version").fetchone()[0])


def test_a_new_file_gets_the_baseline_marked_as_flowmem(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    store = SQLiteStore(str(path))
    store.append(KEY, [{"role": "user", "content": "hi"}], max_messages=None,
                 lock_timeout=1.0)
    store.close()
    assert _marker(path) == (APPLICATION_ID, SCHEMA_VERSION)
    with sqlite3.connect(path) as conn:
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_schema")}
    assert {"kv", "buffers", "messages", "calls", "idempotency", "declarations",
            "messages_position", "messages_result", "buffers_version"} <= names
    again = SQLiteStore(str(path))  # a second open uses it as it is
    assert again.history(KEY).total == 1
    assert again.integrity_check() == "ok"
    again.close()


def test_an_empty_existing_file_gets_the_baseline(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    SQLiteStore(str(path)).close()
    assert _marker(path) == (APPLICATION_ID, SCHEMA_VERSION)


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION))
def test_an_earlier_builds_file_is_refused_with_how_to_move_its_data_and_left_unchanged(
        tmp_path: Path, version: int) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(_EARLIER_BUILD)
        conn.execute(f"PRAGMA user_version = {version}")
    conn.close()
    before = _digest(path)
    for mode in ("rwc", "ro"):
        with pytest.raises(SchemaError) as refused:
            SQLiteStore(str(path), mode=mode)
        text = str(refused.value)
        assert "earlier build" in text and f"schema version {version}" in text
        assert "flowmem export" in text and "flowmem import" in text
    assert _digest(path) == before
    assert not (tmp_path / "old.db-wal").exists() or (tmp_path / "old.db-wal").stat().st_size == 0
    with sqlite3.connect(path) as conn:  # its data is still there for the old build
        assert conn.execute("SELECT count(*) FROM messages").fetchone() == (1,)
    conn.close()


def test_a_file_an_earlier_build_marked_as_flowmems_is_refused_as_an_earlier_builds(
        tmp_path: Path) -> None:
    path = tmp_path / "marked.db"
    SQLiteStore(str(path)).close()
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 10")  # the unreleased builds' last marked version
    conn.close()
    before = _digest(path)
    with pytest.raises(SchemaError, match=r"earlier build .*flowmem export"):
        SQLiteStore(str(path))
    assert _digest(path) == before


@pytest.mark.parametrize("version", [SCHEMA_VERSION + 1, 99, 0])
def test_a_newer_or_unknown_version_is_refused(tmp_path: Path, version: int) -> None:
    path = tmp_path / "newer.db"
    SQLiteStore(str(path)).close()
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {version}")
    conn.close()
    before = _digest(path)
    for mode in ("rwc", "ro"):
        with pytest.raises(SchemaError, match=f"schema version {version};"):
            SQLiteStore(str(path), mode=mode)
    assert _digest(path) == before


@pytest.mark.parametrize("marker", ["PRAGMA user_version = 42", "PRAGMA application_id = 7",
                                    "SELECT 1"])
def test_another_programs_database_is_refused(tmp_path: Path, marker: str) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.execute(marker)
    conn.close()
    before = _digest(path)
    with pytest.raises(SchemaError, match="not a flowmem database"):
        SQLiteStore(str(path))
    assert _digest(path) == before


def test_a_read_only_store_never_creates_the_schema(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    with pytest.raises(SchemaError, match="read-only"):
        SQLiteStore(str(path), mode="ro")
    assert path.stat().st_size == 0
