"""Upgrading a database written by an earlier flowmem: migration 3 (#14) rewrites the
messages table and keeps every conversation exactly, its rule indexes included."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from flowmem.messages import canonical_messages
from flowmem.scopes import StorageKey
from flowmem.stores.sqlite import SQLiteStore
from flowmem.stores.sqlite_schema import MIGRATIONS

KEY = StorageKey("session", "s1", "chat")
CALL = {"role": "assistant", "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f",
                                                                    "arguments": "{}"}},
                       {"id": "c2", "type": "function", "function": {"name": "g",
                                                                    "arguments": "{}"}}]}


def _version_2_copy(source: Path, target: Path) -> None:
    """``source``'s rows in a database at schema version 2 (as flowmem 0.2 wrote it)."""
    old = sqlite3.connect(target, isolation_level=None)
    old.execute("PRAGMA journal_mode=WAL")
    for migration in MIGRATIONS[:2]:
        for statement in migration.split(";"):
            if statement.strip():
                old.execute(statement)
    old.execute("PRAGMA user_version = 2")
    new = sqlite3.connect(source)
    for table in ("kv", "buffers", "messages", "calls", "pending"):
        rows = new.execute(f"SELECT * FROM {table}").fetchall()
        if rows:
            marks = ", ".join("?" for _ in rows[0])
            old.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
    new.close()
    old.close()


def test_a_version_2_database_is_migrated_with_its_conversations(tmp_path: Path) -> None:
    written = SQLiteStore(str(tmp_path / "new.db"))
    written.append(KEY, canonical_messages([{"role": "user", "content": "hi"}, CALL,
                                            {"role": "tool", "tool_call_id": "c1",
                                             "content": "one"}]),
                   max_messages=None, lock_timeout=5.0)
    written.write(StorageKey("user", "u1", "prefs"), {"theme": "dark"})
    before = written.read(KEY)
    written.close()
    _version_2_copy(tmp_path / "new.db", tmp_path / "old.db")

    store = SQLiteStore(str(tmp_path / "old.db"))
    assert store.read(KEY) == before
    assert store.read(StorageKey("user", "u1", "prefs")) == (True, {"theme": "dark"})
    again = canonical_messages([{"role": "tool", "tool_call_id": "c1", "content": "dup"}])
    assert store.append(KEY, again, max_messages=None, lock_timeout=5.0).appended == 0  # MEM-1
    healed = store.append(KEY, canonical_messages([{"role": "user", "content": "next"}]),
                          max_messages=None, lock_timeout=5.0)
    assert healed.count == 5  # MEM-3: c2's placeholder after c1's result, then the user turn
    assert store.integrity_check() == "ok"
    store.close()
    with sqlite3.connect(tmp_path / "old.db") as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        tables = {row[0] for row in raw.execute("SELECT name FROM sqlite_schema")}
    assert "calls_turn" not in tables and "messages_by_position" not in tables
