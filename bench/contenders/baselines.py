"""What a conversation memory costs without a library: the floors, and a naive JSON blob.

``python-list`` is ``list.append`` of the dict. ``raw-sqlite-*`` is Python's
``sqlite3``, one row per message (``INSERT`` of the ``json.dumps`` text, then
``COMMIT``), at WAL + NORMAL and at the durabilities the peers use by default:
WAL + FULL (flowmem, LangGraph's SqliteSaver, the Agents SDK) and rollback
journal + FULL (SQLite's own defaults: LangChain through SQLAlchemy, the JSON
blob); ``read_last`` is an indexed ``ORDER BY id DESC LIMIT n``. ``json-blob``
is what many home-grown memories do: the whole conversation as one value, read,
decoded, re-encoded and rewritten per append. They store what they are given.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from .base import Contender

DEFAULTS = "rollback journal (DELETE), synchronous=FULL (SQLite's defaults)"
INSERT = "INSERT INTO messages (conversation, body) VALUES (?, ?)"


class PythonList(Contender):
    name = "python-list"
    label = "floor: Python list"
    durability = "none (in process)"
    kind = "floor"
    persistent = False
    reference = "flowmem-memory"

    def open(self, workdir: Path, *, bulk: bool = False) -> None:
        super().open(workdir)
        self.lists: dict[str, list[Any]] = {}

    def prefill(self, conversation: str, items: Sequence[Any]) -> None:
        self.lists.setdefault(conversation, []).extend(items)

    def append(self, conversation: str, item: Any) -> None:
        self.lists.setdefault(conversation, []).append(item)

    def read_all(self, conversation: str) -> Any:
        return list(self.lists[conversation])

    def read_last(self, conversation: str, n: int) -> Any:
        return self.lists[conversation][-n:]


class _RawSQLite(Contender):
    kind = "floor"
    journal: ClassVar[str] = "WAL"
    synchronous: ClassVar[str] = "FULL"

    def open(self, workdir: Path, *, bulk: bool = False) -> None:
        super().open(workdir)
        self.conn = sqlite3.connect(str(workdir / "raw.db"), isolation_level=None)
        self.conn.execute(f"PRAGMA journal_mode={self.journal}")
        self.conn.execute(f"PRAGMA synchronous={self.synchronous}")
        self.conn.execute("CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, "
                          "conversation TEXT NOT NULL, body TEXT NOT NULL)")
        self.conn.execute("CREATE INDEX IF NOT EXISTS messages_conversation "
                          "ON messages (conversation, id)")

    def prefill(self, conversation: str, items: Sequence[Any]) -> None:
        self.conn.execute("BEGIN")
        self.conn.executemany(INSERT, [(conversation, json.dumps(item)) for item in items])
        self.conn.execute("COMMIT")

    def append(self, conversation: str, item: Any) -> None:
        execute = self.conn.execute
        execute("BEGIN")
        execute(INSERT, (conversation, json.dumps(item)))
        execute("COMMIT")

    def read_all(self, conversation: str) -> Any:
        return [json.loads(row[0]) for row in self.conn.execute(
            "SELECT body FROM messages WHERE conversation = ? ORDER BY id", (conversation,))]

    def read_last(self, conversation: str, n: int) -> Any:
        rows = self.conn.execute("SELECT body FROM messages WHERE conversation = ? "
                                 "ORDER BY id DESC LIMIT ?", (conversation, n)).fetchall()
        return [json.loads(row[0]) for row in reversed(rows)]

    def close(self) -> None:
        self.conn.close()


class RawSQLiteWALNormal(_RawSQLite):
    name = "raw-sqlite-wal-normal"
    label = "floor: raw sqlite3, WAL + NORMAL"
    durability = "WAL, synchronous=NORMAL"
    reference = "flowmem-sqlite-normal"
    synchronous = "NORMAL"


class RawSQLiteWALFull(_RawSQLite):
    name = "raw-sqlite-wal-full"
    label = "floor: raw sqlite3, WAL + FULL"
    durability = "WAL, synchronous=FULL"


class RawSQLiteDeleteFull(_RawSQLite):
    name = "raw-sqlite-delete-full"
    label = "floor: raw sqlite3, rollback journal + FULL"
    durability = DEFAULTS
    journal = "DELETE"


class JSONBlob(Contender):
    name = "json-blob"
    label = "JSON blob per conversation (sqlite3 key-value)"
    durability = DEFAULTS
    notes = "One row per conversation; every append reads, decodes, re-encodes and rewrites it."

    def open(self, workdir: Path, *, bulk: bool = False) -> None:
        super().open(workdir)
        self.conn = sqlite3.connect(str(workdir / "kv.db"))
        self.conn.execute("CREATE TABLE IF NOT EXISTS kv "
                          "(key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        self.conn.commit()

    def read_all(self, conversation: str) -> Any:
        row = self.conn.execute("SELECT value FROM kv WHERE key = ?",
                                (conversation,)).fetchone()
        return json.loads(row[0]) if row else []

    def prefill(self, conversation: str, items: Sequence[Any]) -> None:
        messages = self.read_all(conversation)
        messages.extend(items)
        self.conn.execute("INSERT INTO kv (key, value) VALUES (?, ?) "
                          "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                          (conversation, json.dumps(messages)))
        self.conn.commit()

    def append(self, conversation: str, item: Any) -> None:
        self.prefill(conversation, (item,))  # the whole blob, every time

    def close(self) -> None:
        self.conn.close()
