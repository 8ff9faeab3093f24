"""Every statement of an SQLite append finds its rows by index (#14: an append's cost does
not grow with the conversation). flowmem never runs ``ANALYZE``, so SQLite's planner works
without statistics; these tests read its plans for the statements an append really runs
(the indexed view, MEM-1 results by id, healing and late results), on a long buffer."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flowmem.messages import Message, canonical_messages
from flowmem.scopes import StorageKey
from flowmem.stores.sqlite import _append as sqlite_fast
from flowmem.stores.sqlite._programs import BY_ID_AT_MOST
from flowmem.stores.sqlite._state import HEAD
from flowmem.stores.sqlite._store import SQLiteStore

KEY = StorageKey("session", "s1", "chat")
Statement = tuple[str, tuple[Any, ...]]


def _turn(n: int, calls: int) -> list[Message]:
    ids = [f"call_{n}_{i}" for i in range(calls)]
    return [{"role": "user", "content": f"question {n}"},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": i, "type": "function",
                             "function": {"name": "f", "arguments": "{}"}} for i in ids]},
            *({"role": "tool", "tool_call_id": i, "content": "ok"} for i in ids)]


@pytest.fixture
def cold_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
               ) -> Iterator[tuple[SQLiteStore, list[Statement]]]:
    """A store whose appends always read the view from the tables (no hot copy), with
    every statement they run recorded."""
    store = SQLiteStore(str(tmp_path / "plans.db"), synchronous="off")
    for n in range(60):  # ~300 entries, 240 results: a scan of the buffer is the slow plan
        store.append(KEY, canonical_messages(_turn(n, 3)), max_messages=None, lock_timeout=5)
    store._programs().hot = None
    seen: list[Statement] = []

    def recording(cursor: sqlite3.Cursor) -> Any:
        def execute(sql: str, params: Any) -> Any:
            seen.append((sql, tuple(params)))
            return cursor.execute(sql, params).fetchall()
        return execute

    monkeypatch.setattr(sqlite_fast, "executor", recording)
    yield store, seen
    store.close()


def _plan(path: str, statement: Statement) -> list[str]:
    with sqlite3.connect(path) as conn:
        return [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + statement[0],
                                               statement[1])]


def _scans_the_buffer(line: str) -> bool:
    """A plan step that visits every message (or call) of the buffer: a scan, or a
    search of a key (the positions' index, the calls' key) by its buffer alone."""
    table = line.split()[1] if len(line.split()) > 1 else ""
    return table in ("messages", "calls") and (
        line.startswith("SCAN") or line.endswith("(buffer_id=?)"))


_NEWEST = HEAD.format(column="head_count", buffer="?")[1:-1]
_NEWEST_SEEK = "SEARCH messages USING INDEX messages_position (buffer_id=?)"
_NEWEST_POSITION = "SEARCH messages USING COVERING INDEX messages_position (buffer_id=?)"
"""The same seek when only the newest entry's position is read (the index holds it)."""


def _scans(statement: Statement, plan: list[str]) -> list[str]:
    """The steps of ``plan`` that visit a whole buffer, less the seeks of the newest entry
    (schema 7's state, :data:`HEAD`): the same plan line, but the first row of the
    positions' index (schema 9) read backwards is the one wanted (``ORDER BY pos DESC
    LIMIT 1`` and no sort: :func:`test_the_state_is_one_seek_of_the_newest_entry`)."""
    scans = [line for line in plan if _scans_the_buffer(line)]
    seeks = statement[0].count("ORDER BY pos DESC LIMIT 1)")
    for _ in range(seeks):
        for seek in (_NEWEST_SEEK, _NEWEST_POSITION):
            if seek in scans:
                scans.remove(seek)
                break
    return scans


@pytest.mark.parametrize("calls", [1, 3, 8, 20])
def test_mem1_results_are_read_by_id_however_many_an_append_mentions(
        cold_store: tuple[SQLiteStore, list[Statement]], calls: int) -> None:
    """One seek per id up to ``BY_ID_AT_MOST`` ids, ``IN`` lists beyond: never a scan."""
    store, seen = cold_store
    store.append(KEY, canonical_messages(_turn(100, calls)), max_messages=None,
                 lock_timeout=5)
    by_id = "result_id IN" if calls > BY_ID_AT_MOST else "result_id = ?"
    views = [s for s in seen if by_id in s[0]]
    assert views, "the append read no results by id"
    for statement in seen:
        plan = _plan(store.path, statement)
        assert not _scans(statement, plan), (statement[0], plan)
    assert any("messages_result" in line for line in _plan(store.path, views[0]))


def test_a_late_result_and_a_healed_turn_search_by_index(
        cold_store: tuple[SQLiteStore, list[Statement]]) -> None:
    """MEM-3 healing, then MEM-10 the late result replacing its placeholder."""
    store, seen = cold_store
    turn = _turn(200, 3)
    for messages in (turn[:3], [{"role": "user", "content": "next"}], turn[3:]):
        store.append(KEY, canonical_messages(messages), max_messages=None, lock_timeout=5)
    assert any(s[0].startswith("INSERT INTO messages") and "healed = 1" in s[0] for s in seen)
    for statement in seen:
        plan = _plan(store.path, statement)
        assert not _scans(statement, plan), (statement[0], plan)


def test_the_state_is_one_seek_of_the_newest_entry(
        cold_store: tuple[SQLiteStore, list[Statement]]) -> None:
    """Schema 7: a buffer's state is read from its newest entry, the positions' index
    (schema 9) read backwards from the buffer's end — no sort, no scan (MEM-12's appends
    stay O(1))."""
    store, _ = cold_store
    assert _plan(store.path, (_NEWEST, (1,))) == [_NEWEST_SEEK]
    with sqlite3.connect(store.path) as conn:
        steps = [row[1] for row in conn.execute("EXPLAIN " + _NEWEST, (1,))]
    assert "SorterOpen" not in steps and "Prev" in steps  # backwards, first row: LIMIT 1
