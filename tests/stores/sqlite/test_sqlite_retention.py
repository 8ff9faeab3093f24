"""Retention on SQLite, checked in the tables themselves: after a sweep no row of an
expired conversation or value is left (buffers, messages, calls, kv, idempotency), live
ones are untouched, and the sweep's selection and each purge use the expiry index or
the conversation's key."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from flowmem import ExecutionContext, Memory

CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def _rows(path: Path, scope_id: str) -> dict[str, int]:
    with sqlite3.connect(path) as conn:
        ids = "(SELECT id FROM buffers WHERE scope_id = ?)"
        return {
            "buffers": conn.execute("SELECT count(*) FROM buffers WHERE scope_id = ?",
                                    (scope_id,)).fetchone()[0],
            "messages": conn.execute(f"SELECT count(*) FROM messages WHERE buffer_id IN {ids}",
                                     (scope_id,)).fetchone()[0],
            "kv": conn.execute("SELECT count(*) FROM kv WHERE scope_id = ?",
                               (scope_id,)).fetchone()[0],
            "all_messages": conn.execute("SELECT count(*) FROM messages").fetchone()[0],
            "calls": conn.execute("SELECT count(*) FROM calls").fetchone()[0],
            "idempotency": conn.execute("SELECT count(*) FROM idempotency").fetchone()[0]}


def test_a_sweep_leaves_no_row_of_what_expired(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    now = [time.time()]
    memory = Memory.from_url(f"sqlite:///{path}", retention={"session": 60, "user": 60},
                             clock=lambda: now[0])
    gone, kept = ExecutionContext(user_id="ua", session_id="sa"), ExecutionContext(
        user_id="ub", session_id="sb")
    memory.append("session", "talk", [{"role": "user", "content": "x"},
                                      {"role": "assistant", "content": None,
                                       "tool_calls": [CALL]}], context=gone,
                  idempotency_key="once")
    memory.write("user", "pref", 1, context=gone, idempotency_key="w")
    now[0] += 61
    memory.append("session", "talk", {"role": "user", "content": "y"}, context=kept)
    memory.write("user", "pref", 2, context=kept)
    assert _rows(path, "sa")["buffers"] == 1  # expired, invisible, not yet deleted
    swept = memory.sweep(batch=1)
    assert swept.by_scope == {"session": 1, "user": 1}
    after = _rows(path, "sa")
    assert after == {"buffers": 0, "messages": 0, "kv": 0, "all_messages": 1, "calls": 0,
                     "idempotency": 0}, after
    assert _rows(path, "sb")["buffers"] == 1 and _rows(path, "ub")["kv"] == 1
    assert memory.sweep().total == 0
    memory.close()


def test_the_sweep_and_the_purge_use_an_index(tmp_path: Path) -> None:
    from flowmem.scopes import StorageKey
    from flowmem.stores.sqlite._programs import SQLiteConversations

    path = tmp_path / "p.db"
    Memory.from_url(f"sqlite:///{path}").close()
    programs = SQLiteConversations()
    with sqlite3.connect(path) as conn:
        plan = conn.execute("EXPLAIN QUERY PLAN SELECT id, scope, scope_id, key FROM buffers "
                            "WHERE expires_at <= ? ORDER BY expires_at LIMIT ?",
                            (1.0, 10)).fetchall()
        assert "buffers_expires" in str(plan), plan
        for sql, params in programs.purge_statements(StorageKey("session", "s", "k"), 1.0):
            plan = conn.execute(f"EXPLAIN QUERY PLAN {sql}", params).fetchall()
            assert "SCAN" not in " ".join(row[-1] for row in plan), (sql, plan)
