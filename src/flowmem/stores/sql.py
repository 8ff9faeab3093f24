"""Row-per-message conversations in SQL, shared by the SQLite and PostgreSQL stores.

Tables (created by each backend's migrations)::

    kv(scope, scope_id, key, value)                      plain values
    buffers(id, scope, scope_id, key, count, next_pos)   one row per conversation
    messages(buffer_id, pos, role, result_id, healed, body)
        UNIQUE (buffer_id, pos)
        UNIQUE (buffer_id, result_id) WHERE result_id IS NOT NULL
    calls(buffer_id, call_id, turn_pos, ord)             every declaration
    pending(buffer_id, call_id, turn_pos, ord)           unanswered calls

Every statement an append runs is an indexed look-up or a bounded range scan;
none reads the whole conversation. A result is written with one upsert on
the (buffer, result id) unique key, so even two unserialized writers cannot
store a result twice (MEM-1), and a real result overwrites only a healed
placeholder, in place (MEM-10). All the rule decisions come from
:func:`flowmem.plan.plan_append`; this module only executes them.

Bodies are JSON text with every non-ASCII code point escaped, so NUL and
lone surrogates round-trip the same way on every backend.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Final

from ..entries import derive_indexes, edit_entries
from ..errors import KeyConflict
from ..ids import is_healed
from ..messages import Message, healed_placeholder
from ..plan import (
    AddEntry,
    AppendPlan,
    BufferView,
    HealTurn,
    NewTurn,
    PendingCall,
    ReplacePlaceholder,
    mentioned_ids,
    needs_pending,
)
from ..scopes import StorageKey
from ..store import HistoryPage

__all__ = ["Execute", "SQLConversations", "decode", "encode"]

Execute = Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]
"""Runs one statement (``?`` placeholders) in the current transaction; returns its rows."""

_UPSERT_RESULT: Final = (
    "INSERT INTO messages (buffer_id, pos, role, result_id, healed, body) "
    "VALUES (?, ?, 'tool', ?, ?, ?) "
    "ON CONFLICT (buffer_id, result_id) WHERE result_id IS NOT NULL DO UPDATE "
    "SET body = excluded.body, healed = excluded.healed "
    "WHERE messages.healed = 1 AND excluded.healed = 0 RETURNING pos"
)


def encode(value: Any) -> str:
    """JSON text, ASCII only (NUL and lone surrogates escaped)."""
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"), allow_nan=False)


def decode(text: str) -> Any:
    """The inverse of :func:`encode`."""
    return json.loads(text)


def _marks(items: Sequence[Any]) -> str:
    return ", ".join("?" for _ in items)


class SQLConversations:
    """The conversation statements over one transaction's :data:`Execute`.

    ``lock_row`` is appended to the statement that reads a buffer's row
    inside an append (``" FOR UPDATE"`` on PostgreSQL, ``""`` on SQLite whose
    ``BEGIN IMMEDIATE`` already holds the write lock).
    """

    def __init__(self, execute: Execute, *, lock_row: str = "") -> None:
        self.run = execute
        self.lock_row = lock_row

    # -- buffers --------------------------------------------------------------
    def buffer_id(self, key: StorageKey) -> int | None:
        rows = self.run("SELECT id FROM buffers WHERE scope = ? AND scope_id = ? AND key = ?",
                        (key.scope, key.scope_id, key.key))
        return int(rows[0][0]) if rows else None

    def open_buffer(self, key: StorageKey) -> tuple[int, int, int]:
        """``(id, count, next_pos)`` of the key's buffer, created and row-locked.

        One statement when the buffer exists (a key never holds a value and a
        conversation at once: ``write`` drops the buffer, ``append`` refuses a
        value), three when it is created.
        """
        where = (key.scope, key.scope_id, key.key)
        select = ("SELECT id, count, next_pos FROM buffers "
                  "WHERE scope = ? AND scope_id = ? AND key = ?" + self.lock_row)
        rows = self.run(select, where)
        if not rows:
            if self.run("SELECT 1 FROM kv WHERE scope = ? AND scope_id = ? AND key = ?", where):
                raise KeyConflict(f"key {key.key!r} holds a plain value, not a conversation")
            self.run("INSERT INTO buffers (scope, scope_id, key) VALUES (?, ?, ?) "
                     "ON CONFLICT (scope, scope_id, key) DO NOTHING", where)
            rows = self.run(select, where)
        return int(rows[0][0]), int(rows[0][1]), int(rows[0][2])

    def keys(self, scope: str, scope_id: str, prefix: str, after: str | None,
             limit: int) -> list[str]:
        """Value and conversation keys under one scope id, by code point, paged by ``after``."""
        low = max(prefix, after) if after is not None else prefix
        query = ("SELECT key FROM {t} WHERE scope = ? AND scope_id = ? AND key >= ? "
                 "AND key < ? AND key <> ?")
        params = (scope, scope_id, low, prefix + "\U0010ffff", after or "")
        union = f"{query.format(t='kv')} UNION {query.format(t='buffers')} ORDER BY key LIMIT ?"
        return [row[0] for row in self.run(union, (*params, *params, limit))]

    def drop_buffer(self, buffer_id: int) -> None:
        for table in ("messages", "calls", "pending"):
            self.run(f"DELETE FROM {table} WHERE buffer_id = ?", (buffer_id,))
        self.run("DELETE FROM buffers WHERE id = ?", (buffer_id,))

    # -- the planner's view ---------------------------------------------------
    def view(self, buffer_id: int, incoming: Sequence[Message]) -> BufferView:
        """The planner's view in one statement: results and declarations of the ids
        ``incoming`` mentions, and the pending calls when it heals (indexed look-ups)."""
        ids = sorted(mentioned_ids(incoming))
        parts: list[str] = []
        params: list[Any] = []
        if ids:
            parts += [f"SELECT 0, result_id, healed, 0 FROM messages WHERE buffer_id = ? "
                      f"AND result_id IN ({_marks(ids)})",
                      f"SELECT 1, call_id, 0, 0 FROM calls WHERE buffer_id = ? "
                      f"AND call_id IN ({_marks(ids)})"]
            params += [buffer_id, *ids, buffer_id, *ids]
        if needs_pending(incoming):
            parts.append("SELECT 2, call_id, turn_pos, ord FROM pending WHERE buffer_id = ?")
            params.append(buffer_id)
        results: dict[str, bool] = {}
        declared: set[str] = set()
        pending: list[PendingCall] = []
        if parts:
            for kind, call, first, second in self.run(" UNION ALL ".join(parts), params):
                if kind == 0:
                    results[call] = bool(first)
                elif kind == 1:
                    declared.add(call)
                else:
                    pending.append(PendingCall(call, int(first), int(second)))
        return BufferView(results, declared, pending)

    # -- applying a plan ------------------------------------------------------
    def apply(self, buffer_id: int, count: int, next_pos: int, plan: AppendPlan,
              slot: int, max_messages: int | None) -> tuple[int, int]:
        """Execute ``plan`` and the window; returns ``(count, appended)``."""
        added: dict[int, int] = {}
        appended = 0
        for op in plan.ops:
            if isinstance(op, AddEntry):
                if self._add(buffer_id, next_pos, op):
                    added[op.ordinal] = next_pos
                    next_pos += slot
                    count += 1
                    appended += 1
            elif isinstance(op, ReplacePlaceholder):
                rows = self.run(_UPSERT_RESULT,
                                (buffer_id, next_pos, op.call_id, 0, encode(op.message)))
                if rows and int(rows[0][0]) == next_pos:  # the placeholder was gone: a new row
                    next_pos, count, appended = next_pos + slot, count + 1, appended + 1
            elif isinstance(op, HealTurn):
                turn = added[op.turn.ordinal] if isinstance(op.turn, NewTurn) else op.turn
                count += self._heal(buffer_id, turn, op.call_ids)
        if max_messages is not None and count > max_messages:
            count -= self._evict(buffer_id, count - max_messages)
        self.run("UPDATE buffers SET count = ?, next_pos = ? WHERE id = ?",
                 (count, next_pos, buffer_id))
        return count, appended

    def _add(self, buffer_id: int, pos: int, op: AddEntry) -> bool:
        body = encode(op.message)
        if op.answers is not None:
            rows = self.run(_UPSERT_RESULT, (buffer_id, pos, op.answers, int(op.healed), body))
            if not rows or int(rows[0][0]) != pos:
                return False  # the unique key refused a duplicate (MEM-1)
            self.run("DELETE FROM pending WHERE buffer_id = ? AND call_id = ?",
                     (buffer_id, op.answers))
        else:
            self.run("INSERT INTO messages (buffer_id, pos, role, result_id, healed, body) "
                     "VALUES (?, ?, ?, NULL, 0, ?)", (buffer_id, pos, op.message["role"], body))
        self._insert_calls("calls", buffer_id, pos, list(enumerate(op.declares)))
        self._insert_calls("pending", buffer_id, pos, [(order, c) for c, order in op.opens])
        return True

    def _insert_calls(self, table: str, buffer_id: int, pos: int,
                      calls: list[tuple[int, str]]) -> None:
        """One multi-row insert of a turn's declarations (or its new pending calls)."""
        if calls:
            rows = ", ".join("(?, ?, ?, ?)" for _ in calls)
            params = [value for order, call in calls for value in (buffer_id, call, pos, order)]
            self.run(f"INSERT INTO {table} (buffer_id, call_id, turn_pos, ord) VALUES {rows} "
                     "ON CONFLICT DO NOTHING", params)

    def _heal(self, buffer_id: int, turn: int, call_ids: Sequence[str]) -> int:
        """Placeholders after ``turn``'s block of results (MEM-3); returns how many."""
        stop = self.run("SELECT pos FROM messages WHERE buffer_id = ? AND pos > ? "
                        "AND role <> 'tool' ORDER BY pos LIMIT 1", (buffer_id, turn))
        if stop:
            end = self.run("SELECT pos FROM messages WHERE buffer_id = ? AND pos < ? "
                           "ORDER BY pos DESC LIMIT 1", (buffer_id, stop[0][0]))
        else:
            end = self.run("SELECT pos FROM messages WHERE buffer_id = ? "
                           "ORDER BY pos DESC LIMIT 1", (buffer_id,))
        base = int(end[0][0])
        for offset, call in enumerate(call_ids, start=1):
            self.run("INSERT INTO messages (buffer_id, pos, role, result_id, healed, body) "
                     "VALUES (?, ?, 'tool', ?, 1, ?)",
                     (buffer_id, base + offset, call, encode(healed_placeholder(call))))
            self.run("DELETE FROM pending WHERE buffer_id = ? AND call_id = ?",
                     (buffer_id, call))
        return len(call_ids)

    def _evict(self, buffer_id: int, excess: int) -> int:
        """The window, exactly as :mod:`flowmem.buffer` defines it; returns rows removed."""
        cutoff = int(self.run("SELECT pos FROM messages WHERE buffer_id = ? ORDER BY pos "
                              "LIMIT 1 OFFSET ?", (buffer_id, excess - 1))[0][0])
        affected = {row[0] for row in self.run(
            "SELECT result_id FROM messages WHERE buffer_id = ? AND pos <= ? "
            "AND result_id IS NOT NULL", (buffer_id, cutoff))}
        declared = {row[0] for row in self.run(
            "SELECT call_id FROM calls WHERE buffer_id = ? AND turn_pos <= ?", (buffer_id, cutoff))}
        self.run("DELETE FROM messages WHERE buffer_id = ? AND pos <= ?", (buffer_id, cutoff))
        self.run("DELETE FROM calls WHERE buffer_id = ? AND turn_pos <= ?", (buffer_id, cutoff))
        removed = excess
        for call in sorted(declared):
            if not self.run("SELECT 1 FROM calls WHERE buffer_id = ? AND call_id = ? LIMIT 1",
                            (buffer_id, call)):
                removed += len(self.run("DELETE FROM messages WHERE buffer_id = ? "
                                        "AND result_id = ? RETURNING pos", (buffer_id, call)))
        for call in sorted(affected | declared):
            self._recompute_pending(buffer_id, call)
        return removed

    def _recompute_pending(self, buffer_id: int, call: str) -> None:
        self.run("DELETE FROM pending WHERE buffer_id = ? AND call_id = ?", (buffer_id, call))
        first = self.run("SELECT turn_pos, ord FROM calls WHERE buffer_id = ? AND call_id = ? "
                         "ORDER BY turn_pos LIMIT 1", (buffer_id, call))
        answered = self.run("SELECT 1 FROM messages WHERE buffer_id = ? AND result_id = ?",
                            (buffer_id, call))
        if first and not answered:
            self.run("INSERT INTO pending (buffer_id, call_id, turn_pos, ord) VALUES (?, ?, ?, ?)",
                     (buffer_id, call, first[0][0], first[0][1]))

    # -- reading ----------------------------------------------------------------
    def messages(self, buffer_id: int) -> list[Message]:
        rows = self.run("SELECT body FROM messages WHERE buffer_id = ? ORDER BY pos",
                        (buffer_id,))
        return [decode(row[0]) for row in rows]

    def history(self, buffer_id: int, last: int | None, before: int | None) -> HistoryPage:
        sql = "SELECT pos, body FROM messages WHERE buffer_id = ?"
        params: list[Any] = [buffer_id]
        if before is not None:
            sql += " AND pos < ?"
            params.append(before)
        if last is None:
            rows = self.run(sql + " ORDER BY pos", params)
            more = False
        else:
            rows = self.run(sql + " ORDER BY pos DESC LIMIT ?", [*params, last + 1])
            more = len(rows) > last
            rows = list(reversed(rows[:last]))
        positions = [int(row[0]) for row in rows]
        return HistoryPage([decode(row[1]) for row in rows], positions,
                           positions[0] if more and positions else None)

    # -- the administrative path (MEM-15) ----------------------------------------
    def edit(self, buffer_id: int, position: int, message: Message | None) -> bool:
        """Replace or delete one entry (decided by :func:`~flowmem.entries.edit_entries`),
        then derive the indexes again: O(length), the administrative path only."""
        rows = self.run("SELECT pos, body FROM messages WHERE buffer_id = ? ORDER BY pos",
                        (buffer_id,))
        edited = edit_entries([(int(pos), decode(body)) for pos, body in rows], position, message)
        if edited is None:
            return False
        for table in ("messages", "calls", "pending"):
            self.run(f"DELETE FROM {table} WHERE buffer_id = ?", (buffer_id,))
        self._rewrite(buffer_id, edited)
        return True

    def _rewrite(self, buffer_id: int, entries: list[tuple[int, Message]]) -> None:
        indexes = derive_indexes(entries)
        owner = {spots[0]: call for call, spots in indexes.results.items()}
        for pos, message in entries:
            answered = owner.get(pos)
            healed = int(answered is not None and is_healed(message))
            self.run("INSERT INTO messages (buffer_id, pos, role, result_id, healed, body) "
                     "VALUES (?, ?, ?, ?, ?, ?)",
                     (buffer_id, pos, message["role"], answered, healed, encode(message)))
        for call, turns in indexes.calls.items():
            for turn, order in turns:
                self.run("INSERT INTO calls (buffer_id, call_id, turn_pos, ord) "
                         "VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                         (buffer_id, call, turn, order))
        for pending in indexes.pending:
            self.run("INSERT INTO pending (buffer_id, call_id, turn_pos, ord) VALUES (?, ?, ?, ?)",
                     (buffer_id, pending.call_id, pending.turn, pending.order))
        self.run("UPDATE buffers SET count = ? WHERE id = ?", (len(entries), buffer_id))

