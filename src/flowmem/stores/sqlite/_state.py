"""Where SQLite keeps a conversation's state: on its newest entry.

A buffer's state is its count, its next position, its unanswered calls (the
JSON object of :class:`~flowmem.stores.sql._apply.PendingInRow`; the only
place their declarations are kept until an answer carries them,
:mod:`flowmem.stores.sql._declarations`) and its version (:mod:`._view_cache`'s
checks). Kept on the buffer's row in ``buffers`` and rewritten by every
append, it would cost one more statement and, because ``buffers`` is its own
b-tree, one more page written per commit (3.65 pages against 2.72,
`python -m bench.sqlite_appends pages`).

The state rides on the newest entry: ``messages`` has four ``head_*``
columns, and **the buffer's state is the ``head_*`` of its entry with the
largest position**; an empty buffer's is its row's (count 0, ``next_pos``,
``pending``, ``version``). The common append (it only adds entries) writes
them with the INSERT of its last entry — the page that INSERT writes anyway —
and runs no other statement for the state. Any other append (healing, a late
result replacing a placeholder, the window), an edit, or an append that adds
nothing writes them with one ``UPDATE`` of the newest entry (or of the row,
when the buffer is left empty), after everything else it did. Older entries
keep the heads they were written with; nothing reads them.

The rule is decided here, once: :class:`HeadSaver` writes the state and
:func:`state_columns` (with the statements built from it) reads it.
"""

from __future__ import annotations

from typing import Final

from ..sql._apply import INSERT_ANSWER, INSERT_ENTRY, PendingInRow
from ..sql._program import Statement

__all__ = ["ANSWER_WITH_HEAD", "BUFFER_ROW", "COUNT_OR_VALUE", "HEAD", "INSERT_WITH_HEAD",
           "NEXT_OF", "ON_NEWEST", "PENDING", "PENDING_OF", "STATE_OF", "VERSION", "HeadSaver",
           "state_columns"]

INSERT_WITH_HEAD: Final = (
    "INSERT INTO messages (buffer_id, pos, role, result_id, healed, body, "
    "head_count, head_next, head_unanswered, head_version) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
"""The INSERT of an append's newest entry, carrying the buffer's state."""
ANSWER_WITH_HEAD: Final = (
    "INSERT INTO messages (buffer_id, pos, role, result_id, healed, body, declared_at, "
    "declared_ord, head_count, head_next, head_unanswered, head_version) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
"""The same, of an entry answering an unanswered call (``INSERT_ANSWER``'s columns)."""
_CARRYING: Final = {INSERT_ENTRY: INSERT_WITH_HEAD, INSERT_ANSWER: ANSWER_WITH_HEAD}
HEAD: Final = "(SELECT {column} FROM messages WHERE buffer_id = {buffer} ORDER BY pos DESC LIMIT 1)"
"""A column of a buffer's newest entry (``{buffer}``: SQL naming its id); one seek."""
_SAVE_ON_NEWEST: Final = (
    "UPDATE messages SET head_count = ?, head_next = ?, head_unanswered = ?, head_version = ? "
    f"WHERE buffer_id = ? AND pos = {HEAD.format(column='pos', buffer='?')}")
_SAVE_EMPTY: Final = "UPDATE buffers SET next_pos = ?, pending = ?, version = ? WHERE id = ?"


def state_columns(buffer: str, row: str = "") -> tuple[str, str, str, str]:
    """The SQL of a buffer's state, ``(count, next position, pending, version)``, for the
    buffer whose id ``buffer`` names and whose ``buffers`` row is ``row`` (a table alias
    with a dot, or ``""``)."""
    def newest(column: str) -> str:
        return HEAD.format(column=column, buffer=buffer)
    return (f"coalesce({newest('head_count')}, 0)",
            f"coalesce({newest('head_next')}, {row}next_pos)",
            f"coalesce({newest('head_unanswered')}, {row}pending)",
            f"coalesce({newest('head_version')}, {row}version)")


_COUNT, _NEXT, PENDING, _VERSION = state_columns("b.id", "b.")
_BY_KEY: Final = "FROM buffers AS b WHERE b.scope = ? AND b.scope_id = ? AND b.key = ?"
_BY_ID: Final = "FROM buffers AS b WHERE b.id = ?"
STATE_OF: Final = f"SELECT b.id, {_COUNT}, {_NEXT}, {PENDING}, {_VERSION} {_BY_KEY}"
"""A key's buffer: ``(id, count, next position, pending, version)``; no row: no buffer."""
BUFFER_ROW: Final = f"SELECT b.id, {_COUNT}, {_NEXT}, {PENDING} {_BY_KEY}"
"""A key's buffer: ``(id, count, next position, pending)`` (the shared programs' row)."""
COUNT_OR_VALUE: Final = (f"SELECT (SELECT {_COUNT} {_BY_KEY}), "
                         "EXISTS (SELECT 1 FROM kv WHERE scope = ? AND scope_id = ? AND key = ?)")
"""A key's buffer's count (``NULL``: no buffer) and whether it holds a value."""
NEXT_OF: Final = f"SELECT {_NEXT} {_BY_ID}"
"""A buffer's next position, by id."""
PENDING_OF: Final = f"SELECT {PENDING} {_BY_ID}"
"""A buffer's unanswered calls (the JSON text), by id."""
VERSION: Final = f"SELECT {_VERSION} {_BY_ID}"
"""A hot copy's buffer's version, read when another connection committed (no row: the
buffer is gone)."""


class HeadSaver:
    """:class:`~flowmem.stores.sql._apply.Saver` of the state on the newest entry."""

    carries = True
    checked = False  # BEGIN IMMEDIATE: the state was read (or known hot) under the lock
    defers = True  # a declaration waits for its answer (sql/_declarations.py)

    @staticmethod
    def carried(entry: Statement, count: int, next_pos: int, pending: PendingInRow,
                version: int | None) -> Statement:
        sql, params = entry
        assert version is not None  # a NULL version reads as the row's
        return _CARRYING[sql], (*params, count, next_pos, pending.encode(), version)

    @staticmethod
    def saved(buffer_id: int, count: int, next_pos: int, pending: PendingInRow,
              version: int | None) -> list[Statement]:
        assert version is not None
        if count == 0:
            return [(_SAVE_EMPTY, (next_pos, pending.encode(), version, buffer_id))]
        return [(_SAVE_ON_NEWEST, (count, next_pos, pending.encode(), version, buffer_id,
                                   buffer_id))]


ON_NEWEST: Final = HeadSaver()
"""The SQLite store's :class:`~flowmem.stores.sql._apply.Saver`."""
