"""The unanswered calls kept in the buffer's state (the row since schema 4, the newest
entry since schema 7): every path that opens, answers, heals or evicts a call keeps the
state exact, equal to the in-memory store (MEM-2, MEM-3)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from flowmem.messages import Message, canonical_messages
from flowmem.scopes import StorageKey
from flowmem.stores import open_store
from flowmem.stores.sqlite._state import PENDING_OF
from flowmem.stores.sqlite._store import SQLiteStore

KEY = StorageKey("session", "s1", "chat")


def _call(*ids: str) -> Message:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": i, "type": "function",
                            "function": {"name": "f", "arguments": "{}"}} for i in ids]}


def _result(call: str) -> Message:
    return {"role": "tool", "tool_call_id": call, "content": f"r-{call}"}


def _user(text: str) -> Message:
    return {"role": "user", "content": text}


STEPS: list[tuple[list[Message], int | None]] = [
    ([_user("a"), _call("c1", "c2")], None),
    ([_result("c1")], None),
    ([_call("c2", "c3")], None),  # c2 declared again: still pending at its first turn
    ([_user("b")], 6),  # heals c2 and c3; the window evicts the first turn
    ([_call("c4"), _call("c4", "c5")], 4),  # evicts c4's first turn: c4 pending again later
    ([_result("c5")], 4),
    ([_user("c")], 5),  # heals c4 after its remaining declaration
    ([_result("c4")], None),  # MEM-10: replaces c4's placeholder in place
]


def _pending(path: Path) -> dict[str, list[int]]:
    with sqlite3.connect(path) as raw:
        (buffer_id,), = raw.execute("SELECT id FROM buffers").fetchall()
        text = raw.execute(PENDING_OF, (buffer_id,)).fetchone()[0]
    raw.close()
    held: dict[str, list[int]] = json.loads(text)
    return held


def test_the_row_keeps_the_calls_the_reference_keeps(tmp_path: Path) -> None:
    """Hot and indexed (a fresh store each step), with and without the window."""
    for fresh in (False, True):
        path = tmp_path / f"p{fresh}.db"
        reference = open_store("memory://")
        store = SQLiteStore(str(path))
        for incoming, window in STEPS:
            messages = canonical_messages(incoming)
            expected = reference.append(KEY, messages, max_messages=window, lock_timeout=5.0)
            got = store.append(KEY, messages, max_messages=window, lock_timeout=5.0)
            assert (got.count, got.appended) == (expected.count, expected.appended)
            assert store.read(KEY) == reference.read(KEY)
            if fresh:
                store.close()
                store = SQLiteStore(str(path))
        assert _pending(path) == {}
        store.close()


def test_an_evicted_declaration_leaves_the_call_pending_at_the_next(tmp_path: Path) -> None:
    """MEM-3 after the window: the call is pending at its first declaration still held."""
    path = tmp_path / "w.db"
    store = SQLiteStore(str(path))
    store.append(KEY, canonical_messages([_call("c1"), _call("c1", "c2")]),
                 max_messages=None, lock_timeout=5.0)
    assert _pending(path) == {"c1": [0, 0], "c2": [1 << 20, 1]}
    store.append(KEY, canonical_messages([_result("c2")]), max_messages=2, lock_timeout=5.0)
    assert _pending(path) == {"c1": [1 << 20, 0]}
    store.append(KEY, canonical_messages([_user("x")]), max_messages=None, lock_timeout=5.0)
    assert _pending(path) == {}
    roles = [m["role"] for m in store.read(KEY)[1]]
    assert roles == ["assistant", "tool", "tool", "user"]  # c1's placeholder after c2's result
    store.close()
