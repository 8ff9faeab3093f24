"""The SQLite store's hot buffers (#14): a connection plans against its own copy of a
buffer's view only while no other connection committed, and never decides a rule
differently for it (MEM-1, MEM-2, MEM-3, MEM-10, MEM-14)."""

from __future__ import annotations

import random
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, run_state_machine_as_test

from flowmem.entries import derive_indexes
from flowmem.errors import StoreError
from flowmem.ids import is_healed, result_id
from flowmem.messages import HEALED_CONTENT, Message, canonical_messages
from flowmem.plan import PendingCall
from flowmem.scopes import StorageKey
from flowmem.store import AppendOutcome, HistoryPage
from flowmem.stores.sqlite import _programs as sqlite_programs
from flowmem.stores.sqlite._state import VERSION
from flowmem.stores.sqlite._store import SQLiteStore
from flowmem.stores.sqlite._view_cache import (
    CAPACITY,
    HotBuffer,
    HotBuffers,
)
from flowmem.testing import StoreModelMachine
from profiles import examples
from sqlite_support import KEY
from sqlite_support import call as _call
from sqlite_support import result as _result
from sqlite_support import user as _user


def _append(store: SQLiteStore, *messages: Message) -> AppendOutcome:
    return store.append(KEY, canonical_messages(list(messages)), max_messages=None,
                        lock_timeout=5.0)


def _warm(store: SQLiteStore) -> None:
    """Appends that leave the connection a copy of the buffer (it creates it: complete)."""
    for _ in range(4):
        _append(store, {"role": "system", "content": "warm"})


class TandemStore:
    """Two real SQLite stores on ONE file, taking appends in random runs: each switch
    is a foreign commit for the other's hot copy (learning by id, then invalidations).

    ``random`` is Hypothesis's (:class:`TandemMachine`), so a failure replays and shrinks."""

    def __init__(self, path: Path) -> None:
        self.stores = [SQLiteStore(str(path)), SQLiteStore(str(path))]
        self.random: random.Random | None = None
        self.turn = 0

    def append(self, key: StorageKey, incoming: Sequence[Message], **options: Any,
               ) -> AppendOutcome:
        assert self.random is not None, "TandemMachine draws it first"
        if self.random.random() < 0.3:
            self.turn = 1 - self.turn
        return self.stores[self.turn].append(key, incoming, **options)

    def read(self, key: StorageKey) -> tuple[bool, Any]:
        return self.stores[1 - self.turn].read(key)

    def history(self, key: StorageKey, **options: Any) -> HistoryPage:
        return self.stores[self.turn].history(key, **options)

    def close(self) -> None:
        for store in self.stores:
            store.close()


class TandemMachine(StoreModelMachine):
    """The model test, the tandem's turns drawn from the example's own data."""

    @initialize(rng=st.randoms(use_true_random=False))
    def draw_turns(self, rng: random.Random) -> None:
        self.store.random = rng  # type: ignore[attr-defined]


def test_two_connections_taking_turns_equal_the_pure_model(tmp_path: Path) -> None:
    """MEM-1/2/3/10/14 + the window, with two connections appending in random runs.

    Under each call-id policy, as :func:`flowmem.testing.store_model_test` runs it.
    """
    for call_ids, count in (("strict", 30), ("per_turn", 15)):
        machine = type("Machine", (TandemMachine,), {
            "open_store": staticmethod(lambda: TandemStore(tmp_path / "tandem.db")),
            "call_ids": call_ids})
        run_state_machine_as_test(machine, settings=settings(
            max_examples=examples(count), stateful_step_count=30, deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]))


def test_a_result_stored_by_another_connection_is_not_stored_twice(tmp_path: Path) -> None:
    """MEM-1 and MEM-3 across connections: the hot copy is dropped on a foreign commit."""
    mine, other = SQLiteStore(str(tmp_path / "a.db")), SQLiteStore(str(tmp_path / "a.db"))
    _warm(mine)
    _append(mine, _call("c1", "c2"))
    _append(other, _result("c1"))
    assert _append(mine, _result("c1", "again")).appended == 0  # MEM-1
    outcome = _append(mine, _user())  # MEM-3: only c2 is healed
    assert outcome.appended == 1
    bodies = mine.read(KEY)[1]
    assert [result_id(m) for m in bodies if m["role"] == "tool"] == ["c1", "c2"]
    assert bodies[-2]["metadata"]["healed"] is True
    mine.close()
    other.close()


@pytest.mark.processes
def test_a_commit_from_another_process_is_seen(tmp_path: Path) -> None:
    """MEM-10 across processes: a late result another process wrote replaces nothing twice."""
    path = tmp_path / "p.db"
    store = SQLiteStore(str(path))
    _warm(store)
    _append(store, _call("c1"), _user())  # c1 is healed with a placeholder
    script = textwrap.dedent(f"""
        from flowmem.messages import canonical_messages
        from flowmem.scopes import StorageKey
        from flowmem.stores.sqlite import SQLiteStore
        store = SQLiteStore({str(path)!r})
        late = {{"role": "tool", "tool_call_id": "c1", "content": "late"}}
        store.append(StorageKey("session", "s1", "chat"), canonical_messages([late]),
                     max_messages=None, lock_timeout=5.0)
        store.close()
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert _append(store, _result("c1", "later still")).appended == 0  # the real one is in
    results = [m for m in store.read(KEY)[1] if m["role"] == "tool"]
    assert [m["content"] for m in results] == ["late"]
    store.close()


def test_a_failed_append_teaches_the_copy_nothing(tmp_path: Path) -> None:
    """A transaction that fails after some of its statements ran is rolled back, and so
    is the hot copy: the next user turn heals nothing the failed append declared."""
    path = tmp_path / "f.db"
    store = SQLiteStore(str(path))
    with sqlite3.connect(path) as raw:  # a real failure half-way through the statements
        raw.execute("CREATE TRIGGER refuse AFTER INSERT ON messages WHEN NEW.role = 'assistant' "
                    "AND NEW.body LIKE '%boom%' "
                    "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")
    raw.close()
    _warm(store)
    with pytest.raises(StoreError):
        _append(store, _call("boom"))
    assert _append(store, _user()).appended == 1  # no placeholder for boom
    assert [m["role"] for m in store.read(KEY)[1]][-1] == "user"
    assert _append(store, _result("boom")).appended == 1  # an orphan result, stored once
    store.close()


def test_the_window_drops_the_copy_and_stays_exact(tmp_path: Path) -> None:
    """The window (eviction) is applied by the SQL executor; the copy is dropped, then
    refilled, and a result of an evicted turn is not resurrected."""
    store = SQLiteStore(str(tmp_path / "w.db"))
    _warm(store)
    for n in range(6):
        store.append(KEY, canonical_messages([_call(f"c{n}"), _result(f"c{n}")]),
                     max_messages=4, lock_timeout=5.0)
    assert store.read(KEY)[1] == canonical_messages([_call("c4"), _result("c4"),
                                                     _call("c5"), _result("c5")])
    for _ in range(4):
        assert _append(store, _result("c5", "dup")).appended == 0
    store.close()


def test_hot_buffers_are_bounded() -> None:
    """At most CAPACITY buffers per connection; a foreign commit only makes a copy
    unchecked (its buffer's version decides)."""
    hot = HotBuffers()
    hot.observe(1)
    for n in range(CAPACITY + 1):
        hot.keep(("s", "i", str(n)), HotBuffer(n, 0, 0))
    assert hot.get(("s", "i", "0")) is None and hot.get(("s", "i", str(CAPACITY))) is not None
    kept = hot.keep(("s", "i", "x"), HotBuffer(1, 0, 0, checked=1))
    hot.observe(2)
    assert not hot.current(kept)
    hot.drop(("s", "i", "x"))
    assert hot.get(("s", "i", "x")) is None


VIEW_OF_IDS = "SELECT 0, result_id, healed, declared_at IS NOT NULL FROM"  # the ids' view


def test_a_partial_copy_reads_only_ids_it_does_not_know(tmp_path: Path) -> None:
    """A new connection's copy of a long buffer starts partial: an append whose ids it
    knows reads no view; one with an unknown id reads that id's view only (MEM-1 decided
    the same way each time); the whole buffer is never read."""
    path = str(tmp_path / "m.db")
    first = SQLiteStore(path, synchronous="off")
    calls = [f"a{n}" for n in range(4)]
    entries = [_user(str(n)) for n in range(24)]
    for call in calls:
        entries += [_call(call), _result(call)]
    _append(first, *entries)
    first.close()
    store = SQLiteStore(path, synchronous="off")
    ran: list[str] = []
    store._connection().set_trace_callback(ran.append)
    reads = []
    for n, call in enumerate(["a0", "a0", "a1", "a2", "a3", "a1"]):
        ran.clear()
        outcome = _append(store, _result(call, "retried"), _user(f"more {n}"))
        assert outcome.appended == 1  # MEM-1: the retried result is not stored again
        assert not any("group_concat" in s for s in ran)  # no page, no whole-buffer read
        reads.append("view" if any(VIEW_OF_IDS in s for s in ran) else "none")
    assert reads == ["view", "none", "view", "view", "view", "none"]
    assert store.read(KEY)[1][-1] == canonical_messages(_user("more 5"))[0]
    store.close()


def test_the_copy_applies_a_plan_as_the_executor_does() -> None:
    """Positions of new pending calls follow the SQL executor's SLOT arithmetic."""
    from flowmem.plan import SLOT, BufferView, plan_append

    buffer = HotBuffer(1, 0, 0)
    incoming = canonical_messages([_call("a", "b"), _result("a"), _user()])
    plan = plan_append(BufferView(), incoming)
    buffer.apply(plan, 4)
    assert (buffer.count, buffer.next_pos) == (4, 3 * SLOT)
    assert buffer.results == {"a": False, "b": True}
    assert buffer.declared == {"a", "b"} and buffer.pending == {}
    buffer.apply(plan_append(buffer.view(), canonical_messages([_call("c")])), 5)
    assert buffer.pending == {"c": PendingCall("c", 3 * SLOT, 0)}


def test_one_view_of_the_live_indexes() -> None:
    """A copy hands the planner one view of its own indexes, which every later change
    shows (MEM-1: a result stored since is known; MEM-3: a call opened since is pending)."""
    from flowmem.plan import plan_append

    buffer = HotBuffer(1, 0, 0)
    view = buffer.view()
    plan = plan_append(view, canonical_messages([_call("a", "b")]))
    buffer.apply(plan, 1)
    assert buffer.view() is view
    assert {call.call_id for call in view.pending} == {"a", "b"}
    buffer.apply(plan_append(view, canonical_messages([_result("a")])), 2)
    assert view.results == {"a": False} and [c.call_id for c in view.pending] == ["b"]
    assert plan_append(view, canonical_messages([_result("a")])).dropped_results == 1


def test_a_value_written_over_a_hot_buffer_is_seen_by_the_next_append(tmp_path: Path) -> None:
    """A write replaces the conversation: the next append to the key refuses (a value is
    not a conversation), and a delete starts it over — never the stale copy."""
    from flowmem.errors import KeyConflict

    store = SQLiteStore(str(tmp_path / "v.db"))
    _warm(store)
    _append(store, _call("c1"))
    store.write(KEY, {"plain": True}, replace=True)
    with pytest.raises(KeyConflict):
        _append(store, _user())
    assert store.delete(KEY).found
    assert _append(store, _result("c1")).count == 1  # c1 is no longer declared: an orphan
    store.close()


def test_writes_to_other_keys_keep_the_copy(tmp_path: Path) -> None:
    """The service writes session records beside each turn: those writes drop only their
    own key's copy, so the conversation stays hot on its connection."""
    store = SQLiteStore(str(tmp_path / "k.db"))
    _warm(store)
    store.write(StorageKey("session", "s1", "record"), {"status": "idle"})
    hot = store._programs().hot
    assert hot is not None and hot.get((KEY.scope, KEY.scope_id, KEY.key)) is not None
    store.close()


def _tailed(store: SQLiteStore, text: str, tail: int = 3) -> tuple[list[str], list[str]]:
    """The tail's contents, and the statements the append ran (traced on its connection)."""
    ran: list[str] = []
    connection = store._connection()
    connection.set_trace_callback(ran.append)
    try:
        outcome = store.append(KEY, canonical_messages([_user(text)]), max_messages=None,
                               lock_timeout=5.0, tail=tail)
    finally:
        connection.set_trace_callback(None)
    assert outcome.tail is not None
    assert outcome.tail == store.history(KEY, last=tail)  # what a separate read gives
    return [m["content"] for m in outcome.tail.messages], ran


def test_a_hot_buffer_answers_the_tail_without_reading_messages(tmp_path: Path) -> None:
    """The tail of a hot buffer's append (the service's echo) is its copy's newest entries:
    read once, then kept by the appends of this connection; a foreign commit, healing
    (MEM-3) or a replaced placeholder (MEM-10) makes it read again, and it stays exact."""
    path = tmp_path / "tail.db"
    store, other = SQLiteStore(str(path)), SQLiteStore(str(path))
    _warm(store)
    contents, ran = _tailed(store, "a")
    assert contents[-1] == "a" and any("group_concat" in sql for sql in ran)
    for text, expected in (("b", ["warm", "a", "b"]), ("c", ["a", "b", "c"]),
                           ("d", ["b", "c", "d"])):
        contents, ran = _tailed(store, text)
        assert contents == expected
        assert not any("group_concat" in sql for sql in ran), ran
    _append(other, _user("foreign"))  # another connection commits: the copy is dropped
    contents, ran = _tailed(store, "e")
    assert contents == ["d", "foreign", "e"] and any("group_concat" in sql for sql in ran)
    _append(store, _call("c1"))
    contents, _ = _tailed(store, "f")  # heals c1 (MEM-3) inside the tail
    assert contents[1:] == [HEALED_CONTENT, "f"]
    _append(store, _result("c1", "late"))  # MEM-10: replaced in place, inside the tail
    contents, ran = _tailed(store, "g", tail=5)
    assert contents[-4:] == [None, "late", "f", "g"] and any("group_concat" in sql for sql in ran)
    contents, ran = _tailed(store, "h", tail=5)
    assert contents[-2:] == ["g", "h"] and not any("group_concat" in sql for sql in ran)
    store.close()
    other.close()


def _traced(store: SQLiteStore, key: StorageKey, text: str) -> list[str]:
    """The statements one append ran on the store's connection."""
    ran: list[str] = []
    connection = store._connection()
    connection.set_trace_callback(ran.append)
    try:
        store.append(key, canonical_messages([_user(text)]), max_messages=None,
                     lock_timeout=5.0, tail=2)
    finally:
        connection.set_trace_callback(None)
    return ran


def test_a_commit_to_another_buffer_keeps_the_copy(tmp_path: Path) -> None:
    """Another connection (another --workers process) appending to ANOTHER buffer costs a
    hot copy one version read, not its view or its tail."""
    path = tmp_path / "workers.db"
    mine, other = SQLiteStore(str(path)), SQLiteStore(str(path))
    _warm(mine)
    _traced(mine, KEY, "read the tail once")
    for n in range(3):
        _append_to(other, StorageKey("session", "s2", "chat"), f"elsewhere {n}")
        ran = _traced(mine, KEY, f"mine {n}")
        assert any(sql.startswith(VERSION.split("?")[0]) for sql in ran)
        assert not any("WITH b" in sql or "group_concat" in sql for sql in ran), ran
    mine.close()
    other.close()


def test_an_older_writer_fails_on_the_file_and_changes_nothing(tmp_path: Path) -> None:
    """A writer of an older flowmem still running on the file when schema 7 moved the
    state onto the newest entry (:mod:`flowmem.stores.sqlite._state`) does not save a state
    nobody reads: its row's ``count`` is gone, so its append fails and is rolled back —
    and the hot copy stays exact (MEM-1)."""
    path = tmp_path / "old.db"
    store = SQLiteStore(str(path))
    _warm(store)
    _traced(store, KEY, "hot")
    _append(store, _call("c1"))
    raw = sqlite3.connect(path)
    with pytest.raises(sqlite3.OperationalError, match="count"), raw:  # a schema-6 append
        buffer_id = raw.execute("SELECT id FROM buffers").fetchone()[0]
        raw.execute("INSERT INTO messages (buffer_id, pos, role, result_id, healed, body) "
                    "SELECT ?, next_pos + 1048576 * 100, 'tool', 'c1', 0, ? FROM buffers "
                    "WHERE id = ?", (buffer_id, '{"role":"tool","tool_call_id":"c1",'
                                                '"content":"old"}', buffer_id))
        raw.execute("UPDATE buffers SET count = count + 1, next_pos = next_pos + 1048576, "
                    "pending = '{}' WHERE id = ?", (buffer_id,))
    raw.close()
    ran = _traced(store, KEY, "after the old writer")
    assert not any("WITH b" in sql for sql in ran)  # nothing committed: still hot
    assert _append(store, _result("c1", "new")).stats.replaced == 1  # MEM-10: late, in place
    again = _append(store, _result("c1", "again"))
    assert (again.appended, again.stats.replaced) == (0, 0)  # MEM-1: stored once
    assert [m["content"] for m in store.read(KEY)[1] if m["role"] == "tool"] == ["new"]
    store.close()


def _append_to(store: SQLiteStore, key: StorageKey, text: str) -> None:
    store.append(key, canonical_messages([_user(text)]), max_messages=None, lock_timeout=5.0)


@pytest.mark.parametrize("ids", [["c1", "c2", "c3", "c4", "c5"], ["c3"], ["c4", "c5"]])
def test_learning_by_id_is_the_view_the_entries_derive(tmp_path: Path, ids: list[str]) -> None:
    """A connection's copy of a buffer another connection wrote learns, by id, exactly what
    the entries derive for those ids: its stored result (MEM-1) and whether it is a
    placeholder (MEM-3, MEM-10), its declaration (MEM-2); an id of neither (c5) is known
    as new. It starts, as a new copy does, knowing the unanswered calls (c4)."""
    writer, reader = SQLiteStore(str(tmp_path / "f.db")), SQLiteStore(str(tmp_path / "f.db"))
    for messages in ([_user("q"), _call("c1", "c2", "c3"), _result("c1")],
                     [_user()],  # MEM-3: c2 and c3 healed
                     [_result("c2", "late")],  # MEM-10: c2's placeholder replaced
                     [_call("c4"), _call("c1")]):  # c4 unanswered, c1 declared again
        _append(writer, *messages)
    page = writer.history(KEY)
    derived = derive_indexes(zip(page.positions, page.messages, strict=True))
    (buffer_id,), = sqlite3.connect(tmp_path / "f.db").execute("SELECT id FROM buffers")
    pending = {call.call_id: call for call in derived.pending}
    assert list(pending) == ["c4"]
    copy = HotBuffer(buffer_id, page.total, 0, declared=set(pending), pending=pending,
                     known=set(pending))
    unknown = [i for i in ids if i not in pending]
    held = reader._within(lambda cursor: sqlite_programs.learned(
        copy, list(unknown),
        cursor.execute(*sqlite_programs.learning(copy, list(unknown))).fetchall()), "DEFERRED")
    assert held == any(i in derived.calls for i in unknown)
    assert copy.known == set(ids) | set(pending)
    assert copy.results == {call: is_healed(page.messages[page.positions.index(spots[0])])
                            for call, spots in derived.results.items() if call in ids}
    assert copy.declared == set(derived.calls) & (set(ids) | set(pending))
    writer.close()
    reader.close()
