"""SQLite schema 8: a declaration waits for its answer (MEM-2 without a random leaf per id).

A call a turn opens as unanswered is kept in the conversation's state, then on the
entry that answers it (``declared_at``, ``declared_ord``); only a declaration that
opens nothing (the id was declared or answered before) has a row of ``calls``. Every
reader still sees every declaration: a hot copy, a cold connection reading the view
of the ids an append mentions, and the window (MEM-2, MEM-3, MEM-10).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flowmem.messages import Message, canonical_messages
from flowmem.store import AppendOutcome
from flowmem.stores.sqlite._store import SQLiteStore
from flowmem.testing import store_model_test
from sqlite_support import KEY
from sqlite_support import call as _call
from sqlite_support import result as _result
from sqlite_support import user as _user


def _append(store: SQLiteStore, *messages: Message,
            window: int | None = None) -> AppendOutcome:
    return store.append(KEY, canonical_messages(list(messages)), max_messages=window,
                        lock_timeout=5.0)


def _rows(path: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as raw:
        rows = raw.execute(sql).fetchall()
    raw.close()
    return rows


def _calls(path: Path) -> list[tuple[Any, ...]]:
    return _rows(path, "SELECT call_id, ord FROM calls ORDER BY call_id")


def _carried(path: Path) -> list[tuple[Any, ...]]:
    return _rows(path, "SELECT result_id, declared_at IS NOT NULL, declared_ord FROM messages "
                       "WHERE result_id IS NOT NULL ORDER BY pos")


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "d.db"


@pytest.fixture
def store(path: Path) -> Iterator[SQLiteStore]:
    opened = SQLiteStore(str(path))
    yield opened
    opened.close()


def _cold(path: Path) -> SQLiteStore:
    """A new store on the file: its first append reads the view of the ids by id."""
    return SQLiteStore(str(path))


def test_a_declaring_turn_writes_no_call_row_and_its_answer_carries_it(
        store: SQLiteStore, path: Path) -> None:
    """MEM-2: the declarations ride on the state, then on their answers."""
    _append(store, _user("hi"), _call("c1", "c2"))
    assert _calls(path) == []
    _append(store, _result("c2"))
    _append(store, _user())  # MEM-3: c1's placeholder carries c1's declaration
    assert _calls(path) == []
    assert _carried(path) == [("c2", 1, 1), ("c1", 1, 0)]
    _append(store, _result("c1", "late"))  # MEM-10: the replacement keeps it
    assert _carried(path) == [("c2", 1, 1), ("c1", 1, 0)]


@pytest.mark.parametrize("then", ["nothing", "answered", "healed", "replaced"])
def test_a_cold_connection_sees_every_declaration(path: Path, then: str) -> None:
    """MEM-2 on a connection that never saw the turn: a repeat of it is dropped whether
    its calls are unanswered, answered, healed (MEM-3) or replaced (MEM-10)."""
    first = _cold(path)
    _append(first, _user("hi"), _call("c1", "c2"))
    steps = {"nothing": [], "answered": [_result("c1"), _result("c2")],
             "healed": [_user()], "replaced": [_user(), _result("c2", "late")]}[then]
    for message in steps:
        _append(first, message)
    first.close()
    for repeat in (_call("c1", "c2"), _call("c2"), _call("c2", "c1")):
        cold = _cold(path)
        assert _append(cold, repeat).appended == 0
        cold.close()
    cold = _cold(path)
    assert _append(cold, _call("c2", "c3")).appended == 1  # one new id keeps the turn
    cold.close()
    assert _calls(path) == [("c2", 0)]  # c3 opens; c2 was declared before: its own row


def test_an_orphan_result_declared_later(store: SQLiteStore, path: Path) -> None:
    """A result no turn declared carries nothing; a later turn declaring its id has a
    row of ``calls`` (it opens nothing: the id has a result), so a cold connection drops
    a repeat of that turn and heals nothing for it (MEM-2, MEM-3)."""
    _append(store, _user("hi"), _result("c9"))
    assert _carried(path) == [("c9", 0, None)]
    _append(store, _call("c9"))
    assert _calls(path) == [("c9", 0)]
    cold = _cold(path)
    assert _append(cold, _call("c9")).appended == 0
    assert _append(cold, _user()).count == 4  # c9 has a result: no placeholder
    cold.close()


def test_the_window_forgets_an_evicted_declaration_on_a_kept_answer(
        store: SQLiteStore, path: Path) -> None:
    """A result whose turn the window evicts stays when a later turn declares its id too;
    it no longer carries the evicted declaration, and the id stays declared (by the later
    turn's row) for a cold connection."""
    _append(store, _user("hi"), _call("c1"), _result("c1"), _call("c1", "c2"))
    assert _calls(path) == [("c1", 0)]  # c1 declared again: its own row
    _append(store, _user("more"), window=4)  # evicts "hi" and the first turn
    kept = store.read(KEY)[1]
    assert [m["role"] for m in kept] == ["tool", "assistant", "tool", "user"]
    assert _carried(path) == [("c1", 0, None), ("c2", 1, 1)]  # c2 healed, carrying its own
    cold = _cold(path)
    assert _append(cold, _call("c1")).appended == 0  # MEM-2: declared by the kept turn
    cold.close()


def test_the_window_reads_unanswered_declarations(store: SQLiteStore, path: Path) -> None:
    """An unanswered call's declaration is in the state only: the window finds it there
    (MEM-3's turn evicted with its calls, nothing healed for them)."""
    _append(store, _call("c1"), _result("c1"), _call("c2"))
    outcome = _append(store, _user("a"), _user("b"), window=2)
    assert outcome.count == 2
    assert [m["content"] for m in store.read(KEY)[1]] == ["a", "b"]
    cold = _cold(path)
    assert _append(cold, _call("c2")).appended == 1  # its turn is gone: a new declaration
    cold.close()


class _ColdEveryAppend:
    """A store that opens the file anew for every operation: every append plans on the
    view read by id (the cold path), never on a connection's copy."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            store = SQLiteStore(self.path)
            try:
                return getattr(store, name)(*args, **kwargs)
            finally:
                store.close()
        return call

    def close(self) -> None:
        pass


def _learns(store: SQLiteStore) -> list[str]:
    """The statements ``store``'s connection runs that read the view of ids by id."""
    ran: list[str] = []
    store._connection().set_trace_callback(ran.append)
    return ran


def _reads_calls_by_id(ran: list[str]) -> bool:
    return any("SELECT 1, call_id, 0, 0 FROM calls WHERE" in sql for sql in ran)


def test_a_copy_learns_all_of_an_id_or_nothing(path: Path) -> None:
    """A copy learns an id it does not know from both keys at once (its stored result and
    its ``calls`` row: here ``c1``, declared again after its answer), so it knows every
    fact of it: the turn declaring ``c1`` again is dropped (MEM-2), and ``c1``'s result,
    re-fired, is not stored twice (MEM-1) without another read, on the short path and on
    the program alike."""
    writer = SQLiteStore(str(path))
    _append(writer, _user("q"), _call("c1"), _result("c1"), _call("c1", "c0"),
            _result("c0"))
    writer.close()
    assert _calls(path) == [("c1", 0)]
    for short in (True, False):
        store = _cold(path)
        store.short_appends = short
        _append(store, _user("more"))  # starts the copy
        buffer = store._programs().hot.get((KEY.scope, KEY.scope_id, KEY.key))
        assert buffer is not None and buffer.known is not None and "c1" not in buffer.known
        ran = _learns(store)
        assert _append(store, _call("c1")).appended == 0
        assert _reads_calls_by_id(ran) and "c1" in buffer.known
        assert buffer.results.get("c1") is False
        ran.clear()
        assert _append(store, _result("c1", "again")).appended == 0
        assert not any("INDEXED BY messages_result" in sql for sql in ran)
        store.close()


def test_a_copy_of_a_buffer_with_call_rows_learns_from_both_keys(path: Path) -> None:
    """A new copy reads none of its buffer's ``calls`` rows: it learns an unknown id from
    the results' key and the calls' key, as a cold connection does."""
    writer = SQLiteStore(str(path))
    ids = [f"c{n}" for n in range(20)]
    _append(writer, _user("q"), _call(*ids), *[_result(i) for i in ids])
    _append(writer, _call(*ids, "fresh"), _result("fresh"))  # each again: a calls row
    writer.close()
    assert len(_calls(path)) == len(ids)
    store = _cold(path)
    _append(store, _user("more"))
    ran = _learns(store)
    assert _append(store, _call("c0", "new")).appended == 1
    assert _reads_calls_by_id(ran)
    assert _append(store, _user()).stats.healed == 1  # "new" only (MEM-2, MEM-3)
    store.close()


def test_a_cold_connection_for_every_append_equals_the_model(tmp_path: Path) -> None:
    """The model-based test (MEM-1, MEM-2, MEM-3, MEM-10, MEM-14, the window) with every
    operation on a new connection."""
    store_model_test(lambda: _ColdEveryAppend(tmp_path / "cold.db"),  # type: ignore[arg-type, return-value]
                     reopenable=True, max_examples=30, steps=15)


def test_a_schema_7_writer_fails_on_the_file_and_changes_nothing(
        store: SQLiteStore, path: Path) -> None:
    """A writer of an older flowmem still running when schema 8 let declarations wait for
    their answers would answer a call whose declaration it cannot see (MEM-2): every
    append of it names ``head_pending``, renamed by the migration, so it fails and is
    rolled back."""
    _append(store, _user("hi"), _call("c1"))
    raw = sqlite3.connect(path)
    with pytest.raises(sqlite3.OperationalError, match="head_pending"), raw:
        (buffer_id,), = raw.execute("SELECT id FROM buffers")
        raw.execute("INSERT INTO messages (buffer_id, pos, role, result_id, healed, body, "
                    "head_count, head_next, head_pending, head_version) "
                    "VALUES (?, 104857600, 'tool', 'c1', 0, '{}', 3, 105906176, '{}', 1)",
                    (buffer_id,))
    raw.close()
    assert _carried(path) == []
    assert _append(store, _result("c1")).count == 3
    assert _carried(path) == [("c1", 1, 0)]
