"""Floors: the least any conversation memory can cost.

``python-list``
    ``list.append`` of the dict: the in-process floor.
``raw-sqlite-*``
    Python's ``sqlite3``, one row per message (``INSERT`` of the
    ``json.dumps`` text, then ``COMMIT``: one transaction per append), at
    WAL + ``synchronous=NORMAL`` and at the durability the peers use by
    default: WAL + FULL (flowmem's default, LangGraph's SqliteSaver, the
    Agents SDK) and rollback journal + FULL (SQLite's own defaults: LangChain
    through SQLAlchemy, the JSON blob). Serializing the dict is inside the
    timed region, as it is for every store. ``read_last`` is an indexed
    ``ORDER BY id DESC LIMIT n``.

Floors store what they are given: re-fired results and interrupted calls
stay as they came.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from .base import Contender

__all__ = ["PythonList", "RawSQLiteDeleteFull", "RawSQLiteWALFull", "RawSQLiteWALNormal"]


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
        self.conn.executemany("INSERT INTO messages (conversation, body) VALUES (?, ?)",
                              [(conversation, json.dumps(item)) for item in items])
        self.conn.execute("COMMIT")

    def append(self, conversation: str, item: Any) -> None:
        execute = self.conn.execute
        execute("BEGIN")
        execute("INSERT INTO messages (conversation, body) VALUES (?, ?)",
                (conversation, json.dumps(item)))
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
    reference = "flowmem-sqlite-full"
    synchronous = "FULL"


class RawSQLiteDeleteFull(_RawSQLite):
    name = "raw-sqlite-delete-full"
    label = "floor: raw sqlite3, rollback journal + FULL"
    durability = "rollback journal (DELETE), synchronous=FULL (SQLite's defaults)"
    reference = "flowmem-sqlite-full"
    journal = "DELETE"
    synchronous = "FULL"
