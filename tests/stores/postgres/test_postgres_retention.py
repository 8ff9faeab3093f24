"""Retention on PostgreSQL, checked in the schema itself: after a sweep no row of an
expired conversation or value is left in any table (its idempotency records with it),
while live ones are untouched; the sweep skips rows an open transaction holds."""

from __future__ import annotations

import time

import psycopg
import pytest

from backends import POSTGRES_URL, unavailable
from flowmem import ExecutionContext, Memory
from flowmem.scopes import StorageKey, conversation_key
from postgres_support import throwaway_schema

REASON = unavailable("postgres")
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")
TABLES = {"buffers": "id", "kv": "id", "messages": "buffer_id", "calls": "buffer_id",
          "idempotency": "buffer_id"}


def _rows(schema: str, key: StorageKey) -> dict[str, int]:
    with psycopg.connect(POSTGRES_URL) as conn:
        return {table: conn.execute(f'SELECT count(*) FROM "{schema}".{table} '
                                    f"WHERE {column} = %s", (conversation_key(key),)
                                    ).fetchone()[0]  # type: ignore[index]
                for table, column in TABLES.items()}


def test_a_sweep_leaves_no_row_of_what_expired() -> None:
    with throwaway_schema("retention") as (url, schema):
        now = [time.time()]
        memory = Memory.from_url(url, retention={"session": 60, "user": 60},
                                 clock=lambda: now[0])
        gone = ExecutionContext(user_id="ua", session_id="sa")
        call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        memory.append("session", "talk", [{"role": "user", "content": "x"},
                                          {"role": "assistant", "content": None,
                                           "tool_calls": [call]}], context=gone,
                      idempotency_key="once")
        memory.write("user", "pref", 1, context=gone, idempotency_key="w")
        talk, pref = StorageKey("session", "sa", "talk"), StorageKey("user", "ua", "pref")
        assert _rows(schema, talk)["messages"] == 2 and _rows(schema, pref)["kv"] == 1
        now[0] += 61
        kept = ExecutionContext(user_id="ub", session_id="sb")
        memory.append("session", "talk", {"role": "user", "content": "y"}, context=kept)
        assert memory.sweep(batch=1).by_scope == {"session": 1, "user": 1}
        assert set(_rows(schema, talk).values()) == {0}
        assert set(_rows(schema, pref).values()) == {0}
        assert _rows(schema, StorageKey("session", "sb", "talk"))["messages"] == 1
        assert memory.sweep().total == 0
        memory.close()


def test_the_sweep_skips_a_row_an_open_transaction_holds() -> None:
    with throwaway_schema("retention_locked") as (url, schema):
        now = [time.time()]
        memory = Memory.from_url(url, retention={"session": 60}, clock=lambda: now[0])
        for name in ("held", "free"):
            memory.append("session", "talk", {"role": "user", "content": "x"},
                          context=ExecutionContext(session_id=name))
        now[0] += 61
        held = conversation_key(StorageKey("session", "held", "talk"))
        with psycopg.connect(POSTGRES_URL) as conn:  # an append's row lock, held open
            conn.execute(f'SELECT 1 FROM "{schema}".buffers WHERE id = %s FOR UPDATE', (held,))
            assert memory.sweep().by_scope == {"session": 1}  # never waited for it
        assert memory.sweep().by_scope == {"session": 1}  # released: swept next time
        memory.close()
