"""PostgreSQL schema 2 -> 3: the unanswered calls move from the ``pending`` table into
their buffer's row, and the rules go on from them (MEM-3 healing, MEM-10 the late result).
The old rows are written as flowmem 0.1 wrote them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from backends import unavailable
from flowmem.ids import is_healed, result_id
from flowmem.messages import Message, canonical_messages
from flowmem.plan import SLOT
from flowmem.scopes import StorageKey
from flowmem.stores import open_store
from flowmem.stores.sql_program import encode
from postgres_support import admin, throwaway_schema

REASON = unavailable("postgres")
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

KEY = StorageKey("session", "s1", "chat")
OTHER = StorageKey("session", "s1", "other")


def _turn() -> list[Message]:
    """A user turn, a call to c1 and c2, and c2's result: c1 is unanswered."""
    return canonical_messages([
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call, "type": "function", "function": {"name": "f", "arguments": "{}"}}
            for call in ("c1", "c2")]},
        {"role": "tool", "tool_call_id": "c2", "content": "two"}])


@pytest.fixture
def old_schema() -> Iterator[str]:
    """A schema at version 2 holding two conversations, each with c1 pending."""
    from flowmem.stores.postgres_schema import MIGRATIONS

    with throwaway_schema("upgrade") as (url, name), admin() as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
        conn.execute(f'SET search_path TO "{name}"')
        conn.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, "
                     "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())")
        for number in (0, 1):
            conn.execute(MIGRATIONS[number])
            conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (number + 1,))
        for key in (KEY, OTHER):
            _old_rows(conn, key)
        yield url


def _old_rows(conn: Any, key: StorageKey) -> None:
    execute = conn.execute
    (buffer_id,), = execute("INSERT INTO buffers (scope, scope_id, key, count, next_pos) "
                            "VALUES (%s, %s, %s, 3, %s) RETURNING id",
                            (key.scope, key.scope_id, key.key, 3 * SLOT)).fetchall()
    user, call, result = _turn()
    for pos, message, answers in ((0, user, None), (SLOT, call, None), (2 * SLOT, result, "c2")):
        execute("INSERT INTO messages VALUES (%s, %s, %s, %s, 0, %s)",
                (buffer_id, pos, message["role"], answers, encode(message)))
    for order, call_id in enumerate(("c1", "c2")):
        execute("INSERT INTO calls VALUES (%s, %s, %s, %s)", (buffer_id, call_id, SLOT, order))
    execute("INSERT INTO pending VALUES (%s, 'c1', %s, 0)", (buffer_id, SLOT))


def test_the_pending_table_moves_into_the_rows(old_schema: str) -> None:
    store = open_store(old_schema)
    try:
        with admin() as conn:
            schema = old_schema.rsplit("schema=", 1)[1]
            rows = conn.execute(f'SELECT key, pending FROM "{schema}".buffers '
                                "ORDER BY key").fetchall()
            gone = conn.execute("SELECT to_regclass(%s)", (f'"{schema}".pending',)).fetchone()
        assert [(key, json.loads(text)) for key, text in rows] == [
            ("chat", {"c1": [SLOT, 0]}), ("other", {"c1": [SLOT, 0]})]
        assert gone == (None,)

        # MEM-3: the next user turn heals c1 from the migrated row, after c2's result
        outcome = store.append(KEY, canonical_messages([{"role": "user", "content": "next"}]),
                               max_messages=None, lock_timeout=5)
        assert (outcome.count, outcome.appended) == (5, 1)
        history = store.history(KEY).messages
        assert [result_id(m) for m in history] == [None, None, "c2", "c1", None]
        assert is_healed(history[3])

        # MEM-10 on the other conversation: the late result is stored once, not healed
        late = canonical_messages([{"role": "tool", "tool_call_id": "c1", "content": "one"}])
        assert store.append(OTHER, late, max_messages=None, lock_timeout=5).appended == 1
        assert store.append(OTHER, late, max_messages=None, lock_timeout=5).appended == 0
        assert store.append(OTHER, canonical_messages([{"role": "user", "content": "u"}]),
                            max_messages=None, lock_timeout=5).count == 5
        assert not any(is_healed(m) for m in store.history(OTHER).messages)
    finally:
        store.close()
