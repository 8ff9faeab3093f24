"""Scan a WHOLE store for anything that names a user: every SQLite table, every table of a
PostgreSQL schema, every Redis key of a prefix (its name and its content).

``needles`` are the user id and the keys of her conversations as the stores write
them (:func:`needles_of`): the 16 hex digits an idempotency record starts with, and
the signed 64-bit number PostgreSQL keys rows by. Each finding says where it is.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import Any

from flowmem.scopes import StorageKey, conversation_key, idempotency_prefix


def needles_of(user_id: str, keys: Iterable[StorageKey]) -> list[str]:
    """The user id, and each key's idempotency prefix and conversation key."""
    found = [user_id]
    for key in keys:
        found += [idempotency_prefix(key)[:-1], str(conversation_key(key))]
    return found


def _named(text: str, needles: list[str]) -> list[str]:
    return [n for n in needles if n in text]


def sqlite_findings(path: str, needles: list[str]) -> list[str]:
    """Every row of every table of the SQLite file that contains a needle."""
    findings: list[str] = []
    conn = sqlite3.connect(path)
    try:
        tables = [row[0] for row in conn.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'table'")]
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{table}"'):
                text = " ".join(str(cell) for cell in row)
                hits = _named(text, needles)
                if hits:
                    findings.append(f"sqlite {table}: {hits} in {text[:120]!r}")
    finally:
        conn.close()
    return findings


def postgres_findings(schema: str, needles: list[str]) -> list[str]:
    """Every row of every table of the PostgreSQL schema that contains a needle."""
    from postgres_support import admin

    findings: list[str] = []
    with admin() as conn:
        tables = [row[0] for row in conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind IN ('r', 'p')", (schema,))]
        for table in tables:
            for (text,) in conn.execute(
                    f'SELECT row_to_json(t)::text FROM "{schema}"."{table}" AS t'):
                hits = _named(text, needles)
                if hits:
                    findings.append(f"postgres {table}: {hits} in {text[:120]!r}")
    return findings


def redis_findings(client: Any, prefix: str, needles: list[str]) -> list[str]:
    """Every key whose name holds the prefix and whose name or content holds a needle."""
    findings: list[str] = []
    for name in client.scan_iter(match=f"*{prefix}*", count=1000):
        text = name.decode("utf-8", "surrogatepass") + " " + _content(client, name)
        hits = _named(text, needles)
        if hits:
            findings.append(f"redis {name!r}: {hits}")
    return findings


def _content(client: Any, name: bytes) -> str:
    kind = client.type(name).decode()
    if kind == "string":
        value = client.get(name)
        parts: list[Any] = [value] if value is not None else []
    elif kind == "hash":
        parts = [x for pair in client.hgetall(name).items() for x in pair]
    elif kind == "zset":
        parts = client.zrange(name, 0, -1)
    elif kind == "set":
        parts = list(client.smembers(name))
    else:
        parts = []
    return " ".join(p.decode("utf-8", "surrogatepass") if isinstance(p, bytes) else str(p)
                    for p in parts)
