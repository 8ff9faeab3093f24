"""The reading programs the SQL stores share: a history page in ONE batch.

:meth:`Reads.history` asks for the buffer's count and whether the key holds
a plain value (one row), the page, and under a cursor the count older than
it, together: PostgreSQL sends them with ``BEGIN`` and ``COMMIT`` in one
round trip; SQLite runs them in turn. The page's statement and its reading
are hooks (:meth:`Reads.page_statement`, :meth:`Reads.page_from`) that
SQLite overrides to read a page as one row (:mod:`.sqlite_programs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from ...errors import KeyConflict
from ...messages import Message
from ...pages import UNPARSED
from ...scopes import StorageKey
from ...store import HistoryPage
from .._codec import decode_all
from ._program import Batch, Program, Rows, Statement

__all__ = ["BUFFER_BY_KEY", "Reads"]

BUFFER_BY_KEY: Final = "(SELECT id FROM buffers WHERE scope = ? AND scope_id = ? AND key = ?)"
"""A subquery naming a key's buffer (its parameters: scope, scope id, key)."""
_COUNT_OR_VALUE: Final = (
    "SELECT (SELECT count FROM buffers WHERE scope = ? AND scope_id = ? AND key = ?), "
    "EXISTS (SELECT 1 FROM kv WHERE scope = ? AND scope_id = ? AND key = ?)")


class Reads:
    """History pages and whole conversations, as SQL programs."""

    count_or_value: str = _COUNT_OR_VALUE
    """A key's buffer's count (``NULL``: no buffer) and whether the key holds a value, as
    one row (parameters: the key, twice)."""

    def key_named(self, key: StorageKey) -> tuple[tuple[Any, ...], str, tuple[Any, ...]]:
        """``key``'s parameters for :attr:`count_or_value`, and the SQL naming its buffer's
        id with that SQL's parameters (a backend that keys rows its own way says so here)."""
        where = (key.scope, key.scope_id, key.key)
        return where, BUFFER_BY_KEY, where

    def history(self, key: StorageKey, last: int | None,
                before: int | None) -> Program[HistoryPage]:
        """One batch (on PostgreSQL one round trip, with ``BEGIN`` and ``COMMIT``): the
        buffer's count and whether the key holds a value (one row), the page, and under a
        cursor the count older than it (an index range count, no row is read)."""
        named, buffer, of_buffer = self.key_named(key)
        statements = [(self.count_or_value, (*named, *named)),
                      self.page_statement(buffer, of_buffer, last, before)]
        if before is not None:
            statements.append((f"SELECT count(*) FROM messages WHERE buffer_id = {buffer} "
                               "AND pos < ?", (*of_buffer, before)))
        head, rows, *older = yield Batch(tuple(statements), final=True)
        count, value = head[0]
        if count is None:
            if value:
                raise KeyConflict(f"key {key.key!r} holds a plain value, not a conversation")
            return HistoryPage(total=0)
        return self.as_page(rows, last, int(older[0][0][0]) if older else int(count))

    def as_page(self, rows: Rows, last: int | None, total: int) -> HistoryPage:
        """The page :meth:`page_statement`'s rows make, with ``total`` entries before its
        cursor, its messages left to parse from their texts (:mod:`flowmem.pages`)."""
        page = self.page_from(rows, last)
        return HistoryPage(UNPARSED, page.positions, page.before, total, page.encoded)

    # -- reading ----------------------------------------------------------------
    @staticmethod
    def messages(buffer_id: int) -> Program[list[Message]]:
        rows = yield ("SELECT body FROM messages WHERE buffer_id = ? ORDER BY pos", (buffer_id,))
        return decode_all([row[0] for row in rows])

    @staticmethod
    def page_statement(buffer: str, params: Sequence[Any], last: int | None,
                       before: int | None) -> Statement:
        """The statement reading the newest ``last + 1`` entries older than ``before`` (all
        of them without ``last``) of the buffer ``buffer`` names (``?`` or a subquery,
        with its ``params``): one more than asked, to know whether older ones exist."""
        sql = f"SELECT pos, body FROM messages WHERE buffer_id = {buffer}"
        values: list[Any] = [*params]
        if before is not None:
            sql += " AND pos < ?"
            values.append(before)
        if last is None:
            return sql + " ORDER BY pos", values
        return sql + " ORDER BY pos DESC LIMIT ?", [*values, last + 1]

    @staticmethod
    def page_from(rows: Rows, last: int | None) -> HistoryPage:
        """The page :meth:`page_statement`'s rows make, oldest first."""
        more = last is not None and len(rows) > last
        if last is not None:
            rows = list(reversed(rows[:last]))
        positions = [int(row[0]) for row in rows]
        texts = [row[1] for row in rows]
        return HistoryPage(UNPARSED, positions, positions[0] if more and positions else None,
                           encoded=texts)

