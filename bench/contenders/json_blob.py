"""A naive key-value store: the whole conversation as one JSON blob, rewritten per append.

What many home-grown memories do: ``SELECT`` the blob, ``json.loads``,
``list.append``, ``json.dumps``, ``UPDATE``, commit — O(length) per append.
A SQLite file opened with Python's ``sqlite3`` defaults (rollback journal,
``synchronous=FULL``), as a naive implementation would.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .base import Contender

__all__ = ["JSONBlob"]


class JSONBlob(Contender):
    name = "json-blob"
    label = "JSON blob per conversation (sqlite3 key-value)"
    durability = "rollback journal (DELETE), synchronous=FULL (SQLite's defaults)"
    reference = "flowmem-sqlite-full"
    notes = "One row per conversation; every append reads, decodes, re-encodes and rewrites it."

    def open(self, workdir: Path, *, bulk: bool = False) -> None:
        super().open(workdir)
        self.conn = sqlite3.connect(str(workdir / "kv.db"))
        self.conn.execute("CREATE TABLE IF NOT EXISTS kv "
                          "(key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        self.conn.commit()

    def _load(self, conversation: str) -> list[Any]:
        row = self.conn.execute("SELECT value FROM kv WHERE key = ?",
                                (conversation,)).fetchone()
        return json.loads(row[0]) if row else []

    def _store(self, conversation: str, messages: list[Any]) -> None:
        self.conn.execute("INSERT INTO kv (key, value) VALUES (?, ?) "
                          "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                          (conversation, json.dumps(messages)))
        self.conn.commit()

    def prefill(self, conversation: str, items: Sequence[Any]) -> None:
        self._store(conversation, self._load(conversation) + list(items))

    def append(self, conversation: str, item: Any) -> None:
        messages = self._load(conversation)
        messages.append(item)
        self._store(conversation, messages)

    def read_all(self, conversation: str) -> Any:
        return self._load(conversation)

    def read_last(self, conversation: str, n: int) -> Any:
        return self._load(conversation)[-n:]

    def close(self) -> None:
        self.conn.close()
