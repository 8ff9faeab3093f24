"""SQLite's variant of the shared SQL programs: the buffer row and the view in ONE statement.

PostgreSQL reads a buffer's row ``FOR UPDATE`` (which a ``UNION`` cannot
carry), so the shared program (:mod:`flowmem.stores.sql`) reads the row, then
the planner's view. Under SQLite's ``BEGIN IMMEDIATE`` the write lock is
already held, so both are one statement: a CTE names the buffer and every
part of the view looks it up by that subquery. The rows and the plan are the
same; only the number of round trips changes.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..messages import Message
from ..plan import BufferView
from ..scopes import StorageKey
from .sql import Program, SQLConversations, view_from, view_parts

__all__ = ["SQLiteConversations"]

_BUFFER_ROW = ("WITH b AS (SELECT id, count, next_pos FROM buffers "
               "WHERE scope = ? AND scope_id = ? AND key = ?) "
               "SELECT 3, id, count, next_pos FROM b")


class SQLiteConversations(SQLConversations):
    """The shared programs, with :meth:`open_and_view` in one statement."""

    def open_and_view(self, key: StorageKey,
                      incoming: Sequence[Message]) -> Program[tuple[int, int, int, BufferView]]:
        parts, params = view_parts("(SELECT id FROM b)", (), incoming)
        rows = yield (" UNION ALL ".join([_BUFFER_ROW, *parts]),
                      [key.scope, key.scope_id, key.key, *params])
        head = [row for row in rows if row[0] == 3]
        if not head:  # a new buffer (or a value: open_buffer refuses it); nothing to view
            buffer_id, count, next_pos = yield from self.open_buffer(key)
            return buffer_id, count, next_pos, BufferView()
        _, buffer_id, count, next_pos = head[0]
        return int(buffer_id), int(count), int(next_pos), view_from(
            [row for row in rows if row[0] != 3])
