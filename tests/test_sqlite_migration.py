"""Upgrading a database written by an earlier flowmem: migration 3 (#14) rewrites the
messages table, migration 4 moves the unanswered calls into the buffer rows, 7 moves the
state onto the newest entry, 8 lets a declaration wait for its answer, 9 puts the messages
back in a rowid table; each keeps every conversation exactly, its rule indexes included."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from flowmem.ids import result_id
from flowmem.messages import canonical_messages
from flowmem.scopes import StorageKey
from flowmem.stores.sqlite import SQLiteStore
from flowmem.stores.sqlite_head import PENDING, state_columns
from flowmem.stores.sqlite_schema import MIGRATIONS

KEY = StorageKey("session", "s1", "chat")
CALL = {"role": "assistant", "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f",
                                                                    "arguments": "{}"}},
                       {"id": "c2", "type": "function", "function": {"name": "g",
                                                                    "arguments": "{}"}}]}


_STATE = "SELECT b.id, b.scope, b.scope_id, b.key, {} FROM buffers AS b".format(
    ", ".join(state_columns("b.id", "b.")[:3]))


def _old_copy(source: Path, target: Path, version: int) -> None:
    """``source``'s rows in a database at schema ``version`` (2: as flowmem 0.2 wrote it;
    3: before the unanswered calls moved into the buffer rows; 6: before the state moved
    onto the newest entry; 7: before a declaration waited for its answer; 8: before the
    messages moved back into a rowid table, every declaration in ``calls``)."""
    old = sqlite3.connect(target, isolation_level=None)
    old.execute("PRAGMA journal_mode=WAL")
    for migration in MIGRATIONS[:version]:
        for statement in migration.split(";"):
            if statement.strip():
                old.execute(statement)
    old.execute(f"PRAGMA user_version = {version}")
    new = sqlite3.connect(source)
    heads = ", head_count, head_next, head_unanswered, head_version" if version >= 7 else ""
    rows = {table: new.execute(f"SELECT {columns} FROM {table}").fetchall()
            for table, columns in (("kv", "*"), (
                "messages", f"buffer_id, pos, role, result_id, healed, body{heads}"))}
    if version < 8:
        heads = heads.replace("head_unanswered", "head_pending")  # its name until schema 8
    buffers = new.execute(_STATE).fetchall()  # id, scope, scope id, key, count, next, pending
    rows["calls"] = _every_declaration(new, buffers)
    if version >= 7:  # the state rides on the newest entry; the row keeps an empty one's
        rows[f"messages(buffer_id, pos, role, result_id, healed, body{heads})"] = \
            rows.pop("messages")
        rows["buffers(id, scope, scope_id, key)"] = [row[:4] for row in buffers]
    elif version >= 4:
        rows["buffers(id, scope, scope_id, key, count, next_pos, pending)"] = buffers
    else:
        rows["buffers"] = [row[:6] for row in buffers]
        rows["pending"] = [(row[0], call, turn, order) for row in buffers
                           for call, (turn, order) in json.loads(row[6]).items()]
    for table, values in rows.items():
        if values:
            marks = ", ".join("?" for _ in values[0])
            old.executemany(f"INSERT INTO {table} VALUES ({marks})", values)
    new.close()
    old.close()


def _every_declaration(new: sqlite3.Connection,
                       buffers: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Every declaration of a database at this schema, as ``calls`` rows (before schema 8
    every declaration had its row): ``calls``, the answers carrying theirs, and the
    unanswered calls in each state."""
    rows = set(new.execute("SELECT buffer_id, call_id, turn_pos, ord FROM declarations"))
    rows.update((row[0], call, turn, order) for row in buffers
                for call, (turn, order) in json.loads(row[6]).items())
    return sorted(rows)


def _copied(tmp_path: Path, version: int) -> tuple[bool, Any]:
    """A conversation (a user turn, a turn declaring c1 and c2, c1's result) written by
    this flowmem, copied into ``old.db`` at schema ``version``; what it read."""
    written = SQLiteStore(str(tmp_path / "new.db"))
    written.append(KEY, canonical_messages([{"role": "user", "content": "hi"}, CALL,
                                            {"role": "tool", "tool_call_id": "c1",
                                             "content": "one"}]),
                   max_messages=None, lock_timeout=5.0)
    before = written.read(KEY)
    written.close()
    _old_copy(tmp_path / "new.db", tmp_path / "old.db", version)
    return before


def test_a_version_2_database_is_migrated_with_its_conversations(tmp_path: Path) -> None:
    written = SQLiteStore(str(tmp_path / "new.db"))
    written.append(KEY, canonical_messages([{"role": "user", "content": "hi"}, CALL,
                                            {"role": "tool", "tool_call_id": "c1",
                                             "content": "one"}]),
                   max_messages=None, lock_timeout=5.0)
    written.write(StorageKey("user", "u1", "prefs"), {"theme": "dark"})
    before = written.read(KEY)
    written.close()
    _old_copy(tmp_path / "new.db", tmp_path / "old.db", 2)

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
    assert "buffers_version" in tables  # migration 5's trigger (sqlite_hot's version checks)


def test_a_version_3_database_keeps_its_unanswered_calls_in_the_buffer_rows(
        tmp_path: Path) -> None:
    """Migration 4: each buffer's pending rows become its row's ``pending``; the table goes.
    The calls are still unanswered afterwards: MEM-1 drops a repeated result, MEM-3 heals
    the rest at the next user turn, in declaration order."""
    other = StorageKey("session", "s2", "chat")
    written = SQLiteStore(str(tmp_path / "new.db"))
    for key, answered in ((KEY, "c1"), (other, None)):
        batch = [{"role": "user", "content": "hi"}, CALL]
        if answered is not None:
            batch.append({"role": "tool", "tool_call_id": answered, "content": "one"})
        written.append(key, canonical_messages(batch), max_messages=None, lock_timeout=5.0)
    written.append(StorageKey("session", "s3", "chat"),
                   canonical_messages([{"role": "user", "content": "alone"}]),
                   max_messages=None, lock_timeout=5.0)
    written.close()
    _old_copy(tmp_path / "new.db", tmp_path / "old.db", 3)
    with sqlite3.connect(tmp_path / "old.db") as raw:
        assert raw.execute("SELECT count(*) FROM pending").fetchone()[0] == 3

    store = SQLiteStore(str(tmp_path / "old.db"))
    with sqlite3.connect(tmp_path / "old.db") as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        assert "pending" not in {row[0] for row in raw.execute("SELECT name FROM sqlite_schema")}
        held = dict(raw.execute(f"SELECT b.scope_id, {PENDING} FROM buffers AS b").fetchall())
    assert {k: json.loads(v) for k, v in held.items()} == {
        "s1": {"c2": [1 << 20, 1]}, "s2": {"c1": [1 << 20, 0], "c2": [1 << 20, 1]}, "s3": {}}
    again = canonical_messages([{"role": "tool", "tool_call_id": "c1", "content": "dup"}])
    assert store.append(KEY, again, max_messages=None, lock_timeout=5.0).appended == 0  # MEM-1
    user = canonical_messages([{"role": "user", "content": "next"}])
    assert store.append(KEY, user, max_messages=None, lock_timeout=5.0).count == 5  # MEM-3
    assert store.append(other, user, max_messages=None, lock_timeout=5.0).count == 5
    healed = [result_id(m) for m in store.read(other)[1] if m["role"] == "tool"]
    assert healed == ["c1", "c2"]
    assert store.append(other, user, max_messages=None, lock_timeout=5.0).count == 6
    assert store.integrity_check() == "ok"
    store.close()


def test_a_version_6_database_moves_each_state_onto_its_newest_entry(tmp_path: Path) -> None:
    """Migration 7: each buffer's count, next position and unanswered calls move from its
    row onto its newest entry, and the row's count goes. The conversations go on
    exactly (MEM-1, MEM-3); an empty buffer keeps its state in the row."""
    before = _copied(tmp_path, 6)
    with sqlite3.connect(tmp_path / "old.db") as raw:
        raw.execute("INSERT INTO buffers (scope, scope_id, key, next_pos) "
                    "VALUES ('session', 's9', 'chat', 7340032)")  # emptied by its window
    raw.close()

    store = SQLiteStore(str(tmp_path / "old.db"))
    assert store.read(KEY) == before
    with sqlite3.connect(tmp_path / "old.db") as raw:
        columns = {row[1] for row in raw.execute("PRAGMA table_info(buffers)")}
        heads = raw.execute("SELECT pos, head_count, head_next, head_unanswered FROM messages "
                            "WHERE head_count IS NOT NULL").fetchall()
    raw.close()
    assert "count" not in columns
    assert heads == [(2 << 20, 3, 3 << 20, '{"c2":[1048576,1]}')]  # the newest entry only
    again = canonical_messages([{"role": "tool", "tool_call_id": "c1", "content": "dup"}])
    assert store.append(KEY, again, max_messages=None, lock_timeout=5.0).appended == 0  # MEM-1
    user = canonical_messages([{"role": "user", "content": "next"}])
    assert store.append(KEY, user, max_messages=None, lock_timeout=5.0).count == 5  # MEM-3
    empty = StorageKey("session", "s9", "chat")
    assert store.history(empty).total == 0
    store.append(empty, user, max_messages=None, lock_timeout=5.0)
    assert store.history(empty).positions == [7 << 20]  # the row's next position, kept
    assert store.integrity_check() == "ok"
    store.close()


def test_a_version_7_database_keeps_every_declaration_in_calls(tmp_path: Path) -> None:
    """Migration 8: a schema 7 file has every declaration in ``calls`` and its results carry
    none (``declared_at`` is NULL: they are indexed as undeclared). MEM-2 still drops a
    repeated turn, answered or not, on a cold connection; a turn declared after the
    upgrade keeps its declaration in the state, then on its answer."""
    before = _copied(tmp_path, 7)
    with sqlite3.connect(tmp_path / "old.db") as raw:
        assert raw.execute("SELECT count(*) FROM calls").fetchone()[0] == 2
    raw.close()

    store = SQLiteStore(str(tmp_path / "old.db"))
    assert store.read(KEY) == before
    with sqlite3.connect(tmp_path / "old.db") as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        undeclared = raw.execute("SELECT result_id FROM messages WHERE result_id IS NOT NULL "
                                 "AND declared_at IS NULL").fetchall()
    raw.close()
    assert undeclared == [("c1",)]
    assert store.append(KEY, canonical_messages([CALL]), max_messages=None,
                        lock_timeout=5.0).appended == 0  # MEM-2: c1 answered, c2 unanswered
    later = {"role": "assistant", "content": None,
             "tool_calls": [{"id": "c3", "type": "function",
                             "function": {"name": "h", "arguments": "{}"}}]}
    store.append(KEY, canonical_messages([later, {"role": "tool", "tool_call_id": "c3",
                                                  "content": "three"}]),
                 max_messages=None, lock_timeout=5.0)
    store.close()
    with sqlite3.connect(tmp_path / "old.db") as raw:
        assert raw.execute("SELECT count(*) FROM calls").fetchone()[0] == 2  # none for c3
        carried = raw.execute("SELECT declared_ord FROM messages WHERE result_id = 'c3'")
        assert carried.fetchall() == [(0,)]
    raw.close()
    cold = SQLiteStore(str(tmp_path / "old.db"))
    for repeated in (CALL, later):
        assert cold.append(KEY, canonical_messages([repeated]), max_messages=None,
                           lock_timeout=5.0).appended == 0  # MEM-2, read by id
    assert cold.integrity_check() == "ok"
    cold.close()


def test_a_version_8_database_moves_its_messages_into_a_rowid_table(tmp_path: Path) -> None:
    """Migration 9: the clustered messages table becomes a rowid table in (buffer, position)
    order beside the unique ``messages_position`` index; the conversation reads the same,
    and MEM-1, MEM-2 and MEM-3 still hold on it, on a warm and on a cold connection."""
    before = _copied(tmp_path, 8)
    store = SQLiteStore(str(tmp_path / "old.db"))
    assert store.read(KEY) == before
    with sqlite3.connect(tmp_path / "old.db") as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        rows = raw.execute("SELECT id, pos FROM messages ORDER BY id").fetchall()
        indexes = {row[0] for row in raw.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'messages'")}
    raw.close()
    assert [row[0] for row in rows] == [1, 2, 3]  # written in (buffer, position) order
    assert [row[1] for row in rows] == sorted(row[1] for row in rows)
    assert {"messages_position", "messages_result", "messages_marked"} <= indexes
    repeated = canonical_messages([{"role": "tool", "tool_call_id": "c1", "content": "dup"}])
    assert store.append(KEY, repeated, max_messages=None, lock_timeout=5.0).appended == 0
    assert store.append(KEY, canonical_messages([CALL]), max_messages=None,
                        lock_timeout=5.0).appended == 0  # MEM-2: both ids declared
    store.close()
    cold = SQLiteStore(str(tmp_path / "old.db"))
    assert cold.append(KEY, repeated, max_messages=None, lock_timeout=5.0).appended == 0
    healed = cold.append(KEY, canonical_messages([{"role": "user", "content": "next"}]),
                         max_messages=None, lock_timeout=5.0)
    assert healed.count == 5  # MEM-3: c2's placeholder after c1's result, then the turn
    assert cold.integrity_check() == "ok"
    cold.close()


def test_a_schema_8_writers_insert_still_means_the_same_after_migration_9(
        tmp_path: Path) -> None:
    """Migration 9 keeps every column's name and meaning, so the statements of a writer of
    schema 8 still running on the file (they name columns, never the table's key) keep
    working: its row lands at the table's end, found by (buffer, position)."""
    _copied(tmp_path, 8)
    SQLiteStore(str(tmp_path / "old.db")).close()  # migrates to the newest schema
    with sqlite3.connect(tmp_path / "old.db") as raw:
        (buffer_id,), = raw.execute("SELECT id FROM buffers WHERE key = ?", (KEY.key,))
        raw.execute("INSERT INTO messages (buffer_id, pos, role, result_id, healed, body, "
                    "head_count, head_next, head_unanswered, head_version, declared_at, "
                    "declared_ord) VALUES (?, 1, 'user', NULL, 0, '{}', NULL, NULL, NULL, "
                    "NULL, NULL, NULL)", (buffer_id,))
        with pytest.raises(sqlite3.IntegrityError):  # (buffer, position) is still unique
            raw.execute("INSERT INTO messages (buffer_id, pos, role, body) "
                        "VALUES (?, 1, 'user', '{}')", (buffer_id,))
        newest = raw.execute("SELECT pos FROM messages ORDER BY id DESC LIMIT 1").fetchone()
        found = raw.execute("SELECT role FROM messages INDEXED BY messages_position "
                            "WHERE buffer_id = ? AND pos = 1", (buffer_id,)).fetchone()
    raw.close()
    assert newest == (1,)
    assert found == ("user",)
