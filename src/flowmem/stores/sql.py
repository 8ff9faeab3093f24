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

Sans-I/O: every operation is a *program*, a generator that yields
``(statement, params)`` and receives the statement's rows. The same program
runs on a blocking connection (:func:`drive`: SQLite, psycopg) and on an
asyncio one (:func:`adrive`: psycopg's async connection), so the SQL
conversation logic exists once for both faces of the coordinator.

Bodies are JSON text with every non-ASCII code point escaped, so NUL and
lone surrogates round-trip the same way on every backend.
"""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Any, Final, TypeVar

from ..entries import derive_indexes, edit_entries
from ..errors import IdempotencyConflict, KeyConflict
from ..ids import is_healed
from ..messages import Message, healed_placeholder
from ..plan import (
    SLOT,
    AddEntry,
    AppendPlan,
    BufferView,
    HealTurn,
    NewTurn,
    PendingCall,
    ReplacePlaceholder,
    mentioned_ids,
    needs_pending,
    plan_append,
)
from ..scopes import StorageKey
from ..store import AppendOutcome, HistoryPage, Idempotency, plan_stats

__all__ = [
    "AsyncExecute",
    "Execute",
    "Program",
    "SQLConversations",
    "T",
    "adrive",
    "decode",
    "drive",
    "encode",
]

T = TypeVar("T")
Rows = list[tuple[Any, ...]]
Statement = tuple[str, Sequence[Any]]
Program = Generator[Statement, Rows, T]
"""A SQL program: yields ``(statement, params)`` (``?`` placeholders), receives the rows."""

Execute = Callable[[str, Sequence[Any]], Rows]
"""Runs one statement in the current transaction; returns its rows."""

AsyncExecute = Callable[[str, Sequence[Any]], Awaitable[Rows]]
"""The asyncio twin of :data:`Execute`."""


def drive(program: Program[T], execute: Execute) -> T:
    """Run ``program`` to completion on a blocking connection."""
    try:
        statement = next(program)
        while True:
            statement = program.send(execute(*statement))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    finally:
        program.close()


async def adrive(program: Program[T], execute: AsyncExecute) -> T:
    """Run ``program`` to completion on an asyncio connection."""
    try:
        statement = next(program)
        while True:
            statement = program.send(await execute(*statement))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    finally:
        program.close()

_UPSERT_RESULT: Final = (
    "INSERT INTO messages (buffer_id, pos, role, result_id, healed, body) "
    "VALUES (?, ?, 'tool', ?, ?, ?) "
    "ON CONFLICT (buffer_id, result_id) WHERE result_id IS NOT NULL DO UPDATE "
    "SET body = excluded.body, healed = excluded.healed "
    "WHERE messages.healed = 1 AND excluded.healed = 0 RETURNING pos"
)


_CLAIM: Final = (
    "INSERT INTO idempotency (ikey, fingerprint, outcome, expires) VALUES (?, ?, NULL, ?) "
    "ON CONFLICT (ikey) DO UPDATE SET fingerprint = excluded.fingerprint, outcome = NULL, "
    "expires = excluded.expires WHERE idempotency.expires < ? RETURNING 1"
)
_PURGE_ONE_IN: Final = 64  # expired idempotency records are purged by one write in 64


_ENCODER: Final = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), allow_nan=False)


def encode(value: Any) -> str:
    """JSON text, ASCII only (NUL and lone surrogates escaped)."""
    return _ENCODER.encode(value)  # one encoder: json.dumps builds one per call with options


def decode(text: str) -> Any:
    """The inverse of :func:`encode`."""
    return json.loads(text)


def _marks(items: Sequence[Any]) -> str:
    return ", ".join("?" for _ in items)


def view_parts(buffer: str, buffer_params: Sequence[Any],
               incoming: Sequence[Message]) -> tuple[list[str], list[Any]]:
    """The SELECTs of the planner's view (to be joined by UNION ALL) and their params.

    ``buffer`` is the SQL naming the buffer's id (``"?"`` with ``buffer_params``
    ``(id,)``, or a subquery); each row is ``(kind, id, first, second)``.
    """
    ids = sorted(mentioned_ids(incoming))
    parts: list[str] = []
    params: list[Any] = []
    if ids:
        parts += [f"SELECT 0, result_id, healed, 0 FROM messages WHERE buffer_id = {buffer} "
                  f"AND result_id IN ({_marks(ids)})",
                  f"SELECT 1, call_id, 0, 0 FROM calls WHERE buffer_id = {buffer} "
                  f"AND call_id IN ({_marks(ids)})"]
        params += [*buffer_params, *ids, *buffer_params, *ids]
    if needs_pending(incoming):
        parts.append(f"SELECT 2, call_id, turn_pos, ord FROM pending WHERE buffer_id = {buffer}")
        params += buffer_params
    return parts, params


def view_from(rows: Rows) -> BufferView:
    """The :class:`BufferView` of the rows of :func:`view_parts`' statement."""
    results: dict[str, bool] = {}
    declared: set[str] = set()
    pending: list[PendingCall] = []
    for kind, call, first, second in rows:
        if kind == 0:
            results[call] = bool(first)
        elif kind == 1:
            declared.add(call)
        else:
            pending.append(PendingCall(call, int(first), int(second)))
    return BufferView(results, declared, pending)


class SQLConversations:
    """The SQL programs of every store operation (sans-I/O: see the module notes).

    ``lock_row`` is appended to the statements that read a buffer's row
    inside a writing transaction (``" FOR UPDATE"`` on PostgreSQL, ``""`` on
    SQLite whose ``BEGIN IMMEDIATE`` already holds the write lock).
    """

    def __init__(self, *, lock_row: str = "") -> None:
        self.lock_row = lock_row

    # -- store operations: one program each, run inside one transaction ---------
    def read(self, key: StorageKey) -> Program[tuple[bool, Any]]:
        rows = yield ("SELECT value FROM kv WHERE scope = ? AND scope_id = ? AND key = ?",
                      (key.scope, key.scope_id, key.key))
        if rows:
            return True, decode(rows[0][0])
        buffer_id = yield from self.buffer_id(key)
        if buffer_id is None:
            return False, None
        return True, (yield from self.messages(buffer_id))

    def write(self, key: StorageKey, text: str,
              idempotency: Idempotency | None = None) -> Program[None]:
        if idempotency is not None and (yield from self.claim(idempotency)) is not None:
            return
        buffer_id = yield from self.buffer_id(key, lock=True)
        if buffer_id is not None:
            yield from self.drop_buffer(buffer_id)
        yield ("INSERT INTO kv (scope, scope_id, key, value) VALUES (?, ?, ?, ?) "
               "ON CONFLICT (scope, scope_id, key) DO UPDATE SET value = excluded.value",
               (key.scope, key.scope_id, key.key, text))
        if idempotency is not None:
            yield from self.record(idempotency, {})

    def delete(self, key: StorageKey, idempotency: Idempotency | None = None) -> Program[bool]:
        if idempotency is not None:
            first = yield from self.claim(idempotency)
            if first is not None:
                return bool(first["found"])
        found = bool((yield ("DELETE FROM kv WHERE scope = ? AND scope_id = ? AND key = ? "
                             "RETURNING 1", (key.scope, key.scope_id, key.key))))
        buffer_id = yield from self.buffer_id(key, lock=True)
        if buffer_id is not None:
            yield from self.drop_buffer(buffer_id)
            found = True
        if idempotency is not None:
            yield from self.record(idempotency, {"found": found})
        return found

    def append(self, key: StorageKey, incoming: Sequence[Message],
               max_messages: int | None, serialized: bool,
               idempotency: Idempotency | None = None) -> Program[AppendOutcome]:
        """Plan (:func:`~flowmem.plan.plan_append`) against indexed look-ups, then apply."""
        if idempotency is not None:
            first = yield from self.claim(idempotency)
            if first is not None:
                return AppendOutcome(first["count"], first["appended"], serialized, replayed=True)
        buffer_id, count, next_pos, view = yield from self.open_and_view(key, incoming)
        plan = plan_append(view, incoming)
        count, appended = yield from self.apply(buffer_id, count, next_pos, plan, max_messages)
        if idempotency is not None:
            yield from self.record(idempotency, {"count": count, "appended": appended})
        return AppendOutcome(count, appended, serialized, plan_stats(plan))

    # -- idempotency keys (recorded in the transaction of the change they guard) ----
    @staticmethod
    def claim(idempotency: Idempotency) -> Program[dict[str, Any] | None]:
        """Claim the key for this transaction (``None``), or the first outcome recorded
        under it. The claim is a row of the key's unique index: a concurrent repeat
        waits for this transaction and then replays what it recorded."""
        expires = idempotency.now + idempotency.ttl
        claimed = yield (_CLAIM, (idempotency.key, idempotency.fingerprint, expires,
                                  idempotency.now))
        if claimed:
            return None
        rows = yield ("SELECT fingerprint, outcome FROM idempotency WHERE ikey = ?",
                      (idempotency.key,))
        if rows[0][0] != idempotency.fingerprint or rows[0][1] is None:
            raise IdempotencyConflict(f"idempotency key {idempotency.key!r} was used for a "
                                      "different request; a retry must repeat it exactly")
        first: dict[str, Any] = decode(rows[0][1])
        return first

    @staticmethod
    def record(idempotency: Idempotency, outcome: dict[str, Any]) -> Program[None]:
        """Store the outcome a repeat replays (and now and then purge expired keys)."""
        yield ("UPDATE idempotency SET outcome = ? WHERE ikey = ?",
               (encode(outcome), idempotency.key))
        if random.randrange(_PURGE_ONE_IN) == 0:
            yield ("DELETE FROM idempotency WHERE expires < ?", (idempotency.now,))

    def history(self, key: StorageKey, last: int | None,
                before: int | None) -> Program[HistoryPage]:
        rows = yield ("SELECT id, count FROM buffers WHERE scope = ? AND scope_id = ? AND key = ?",
                      (key.scope, key.scope_id, key.key))
        if not rows:
            if (yield ("SELECT 1 FROM kv WHERE scope = ? AND scope_id = ? AND key = ?",
                       (key.scope, key.scope_id, key.key))):
                raise KeyConflict(f"key {key.key!r} holds a plain value, not a conversation")
            return HistoryPage(total=0)
        buffer_id, total = int(rows[0][0]), int(rows[0][1])
        page = yield from self.page(buffer_id, last, before)
        if before is not None:  # an index range count, no row is read
            total = int((yield ("SELECT count(*) FROM messages WHERE buffer_id = ? AND pos < ?",
                                (buffer_id, before)))[0][0])
        return HistoryPage(page.messages, page.positions, page.before, total)

    def edit(self, key: StorageKey, position: int, message: Message | None) -> Program[bool]:
        buffer_id = yield from self.buffer_id(key, lock=True)
        if buffer_id is None:
            return False
        return (yield from self.edit_entry(buffer_id, position, message))

    def keys(self, scope: str, scope_id: str, prefix: str, after: str | None,
             limit: int) -> Program[list[str]]:
        """Value and conversation keys under one scope id, by code point, paged by ``after``."""
        low = max(prefix, after) if after is not None else prefix
        query = ("SELECT key FROM {t} WHERE scope = ? AND scope_id = ? AND key >= ? "
                 "AND key < ? AND key <> ?")
        params = (scope, scope_id, low, prefix + "\U0010ffff", after or "")
        union = f"{query.format(t='kv')} UNION {query.format(t='buffers')} ORDER BY key LIMIT ?"
        return [row[0] for row in (yield (union, (*params, *params, limit)))]

    # -- buffers --------------------------------------------------------------
    def buffer_id(self, key: StorageKey, *, lock: bool = False) -> Program[int | None]:
        rows = yield ("SELECT id FROM buffers WHERE scope = ? AND scope_id = ? AND key = ?"
                      + (self.lock_row if lock else ""), (key.scope, key.scope_id, key.key))
        return int(rows[0][0]) if rows else None

    def open_buffer(self, key: StorageKey) -> Program[tuple[int, int, int]]:
        """``(id, count, next_pos)`` of the key's buffer, created and row-locked.

        One statement when the buffer exists (a key never holds a value and a
        conversation at once: ``write`` drops the buffer, ``append`` refuses a
        value), three when it is created.
        """
        where = (key.scope, key.scope_id, key.key)
        select = ("SELECT id, count, next_pos FROM buffers "
                  "WHERE scope = ? AND scope_id = ? AND key = ?" + self.lock_row)
        rows = yield (select, where)
        if not rows:
            if (yield ("SELECT 1 FROM kv WHERE scope = ? AND scope_id = ? AND key = ?", where)):
                raise KeyConflict(f"key {key.key!r} holds a plain value, not a conversation")
            yield ("INSERT INTO buffers (scope, scope_id, key) VALUES (?, ?, ?) "
                   "ON CONFLICT (scope, scope_id, key) DO NOTHING", where)
            rows = yield (select, where)
        return int(rows[0][0]), int(rows[0][1]), int(rows[0][2])

    def drop_buffer(self, buffer_id: int) -> Program[None]:
        for table in ("messages", "calls", "pending"):
            yield (f"DELETE FROM {table} WHERE buffer_id = ?", (buffer_id,))
        yield ("DELETE FROM buffers WHERE id = ?", (buffer_id,))

    # -- the planner's view ---------------------------------------------------
    def open_and_view(self, key: StorageKey,
                      incoming: Sequence[Message]) -> Program[tuple[int, int, int, BufferView]]:
        """:meth:`open_buffer` then :meth:`view` (a backend may do both in one statement)."""
        buffer_id, count, next_pos = yield from self.open_buffer(key)
        view = yield from self.view(buffer_id, incoming)
        return buffer_id, count, next_pos, view

    def view(self, buffer_id: int, incoming: Sequence[Message]) -> Program[BufferView]:
        """The planner's view in one statement: results and declarations of the ids
        ``incoming`` mentions, and the pending calls when it heals (indexed look-ups)."""
        parts, params = view_parts("?", (buffer_id,), incoming)
        rows = (yield (" UNION ALL ".join(parts), params)) if parts else []
        return view_from(rows)

    # -- applying a plan ------------------------------------------------------
    def apply(self, buffer_id: int, count: int, next_pos: int, plan: AppendPlan,
              max_messages: int | None) -> Program[tuple[int, int]]:
        """Execute ``plan`` and the window; returns ``(count, appended)``."""
        added: dict[int, int] = {}
        appended = 0
        for op in plan.ops:
            if isinstance(op, AddEntry):
                if (yield from self._add(buffer_id, next_pos, op)):
                    added[op.ordinal] = next_pos
                    next_pos += SLOT
                    count += 1
                    appended += 1
            elif isinstance(op, ReplacePlaceholder):
                rows = yield (_UPSERT_RESULT,
                              (buffer_id, next_pos, op.call_id, 0, encode(op.message)))
                if rows and int(rows[0][0]) == next_pos:  # the placeholder was gone: a new row
                    next_pos, count, appended = next_pos + SLOT, count + 1, appended + 1
            elif isinstance(op, HealTurn):
                turn = added[op.turn.ordinal] if isinstance(op.turn, NewTurn) else op.turn
                count += yield from self._heal(buffer_id, turn, op.call_ids)
        if max_messages is not None and count > max_messages:
            count -= yield from self._evict(buffer_id, count - max_messages)
        yield ("UPDATE buffers SET count = ?, next_pos = ? WHERE id = ?",
               (count, next_pos, buffer_id))
        return count, appended

    def _add(self, buffer_id: int, pos: int, op: AddEntry) -> Program[bool]:
        body = encode(op.message)
        if op.answers is not None:
            rows = yield (_UPSERT_RESULT, (buffer_id, pos, op.answers, int(op.healed), body))
            if not rows or int(rows[0][0]) != pos:
                return False  # the unique key refused a duplicate (MEM-1)
            yield ("DELETE FROM pending WHERE buffer_id = ? AND call_id = ?",
                   (buffer_id, op.answers))
        else:
            yield ("INSERT INTO messages (buffer_id, pos, role, result_id, healed, body) "
                   "VALUES (?, ?, ?, NULL, 0, ?)", (buffer_id, pos, op.message["role"], body))
        yield from self._insert_calls("calls", buffer_id, pos, list(enumerate(op.declares)))
        yield from self._insert_calls("pending", buffer_id, pos,
                                      [(order, c) for c, order in op.opens])
        return True

    @staticmethod
    def _insert_calls(table: str, buffer_id: int, pos: int,
                      calls: list[tuple[int, str]]) -> Program[None]:
        """One multi-row insert of a turn's declarations (or its new pending calls)."""
        if calls:
            rows = ", ".join("(?, ?, ?, ?)" for _ in calls)
            params = [value for order, call in calls for value in (buffer_id, call, pos, order)]
            yield (f"INSERT INTO {table} (buffer_id, call_id, turn_pos, ord) VALUES {rows} "
                   "ON CONFLICT DO NOTHING", params)

    @staticmethod
    def _heal(buffer_id: int, turn: int, call_ids: Sequence[str]) -> Program[int]:
        """Placeholders after ``turn``'s block of results (MEM-3); returns how many."""
        stop = yield ("SELECT pos FROM messages WHERE buffer_id = ? AND pos > ? "
                      "AND role <> 'tool' ORDER BY pos LIMIT 1", (buffer_id, turn))
        if stop:
            end = yield ("SELECT pos FROM messages WHERE buffer_id = ? AND pos < ? "
                         "ORDER BY pos DESC LIMIT 1", (buffer_id, stop[0][0]))
        else:
            end = yield ("SELECT pos FROM messages WHERE buffer_id = ? "
                         "ORDER BY pos DESC LIMIT 1", (buffer_id,))
        base = int(end[0][0])
        for offset, call in enumerate(call_ids, start=1):
            yield ("INSERT INTO messages (buffer_id, pos, role, result_id, healed, body) "
                   "VALUES (?, ?, 'tool', ?, 1, ?)",
                   (buffer_id, base + offset, call, encode(healed_placeholder(call))))
            yield ("DELETE FROM pending WHERE buffer_id = ? AND call_id = ?", (buffer_id, call))
        return len(call_ids)

    def _evict(self, buffer_id: int, excess: int) -> Program[int]:
        """The window, exactly as :mod:`flowmem.buffer` defines it; returns rows removed."""
        cutoff = int((yield ("SELECT pos FROM messages WHERE buffer_id = ? ORDER BY pos "
                             "LIMIT 1 OFFSET ?", (buffer_id, excess - 1)))[0][0])
        affected = {row[0] for row in (yield (
            "SELECT result_id FROM messages WHERE buffer_id = ? AND pos <= ? "
            "AND result_id IS NOT NULL", (buffer_id, cutoff)))}
        declared = {row[0] for row in (yield (
            "SELECT call_id FROM calls WHERE buffer_id = ? AND turn_pos <= ?",
            (buffer_id, cutoff)))}
        yield ("DELETE FROM messages WHERE buffer_id = ? AND pos <= ?", (buffer_id, cutoff))
        yield ("DELETE FROM calls WHERE buffer_id = ? AND turn_pos <= ?", (buffer_id, cutoff))
        removed = excess
        for call in sorted(declared):
            if not (yield ("SELECT 1 FROM calls WHERE buffer_id = ? AND call_id = ? LIMIT 1",
                           (buffer_id, call))):
                removed += len((yield ("DELETE FROM messages WHERE buffer_id = ? "
                                       "AND result_id = ? RETURNING pos", (buffer_id, call))))
        for call in sorted(affected | declared):
            yield from self._recompute_pending(buffer_id, call)
        return removed

    @staticmethod
    def _recompute_pending(buffer_id: int, call: str) -> Program[None]:
        yield ("DELETE FROM pending WHERE buffer_id = ? AND call_id = ?", (buffer_id, call))
        first = yield ("SELECT turn_pos, ord FROM calls WHERE buffer_id = ? AND call_id = ? "
                       "ORDER BY turn_pos LIMIT 1", (buffer_id, call))
        answered = yield ("SELECT 1 FROM messages WHERE buffer_id = ? AND result_id = ?",
                          (buffer_id, call))
        if first and not answered:
            yield ("INSERT INTO pending (buffer_id, call_id, turn_pos, ord) VALUES (?, ?, ?, ?)",
                   (buffer_id, call, first[0][0], first[0][1]))

    # -- reading ----------------------------------------------------------------
    @staticmethod
    def messages(buffer_id: int) -> Program[list[Message]]:
        rows = yield ("SELECT body FROM messages WHERE buffer_id = ? ORDER BY pos", (buffer_id,))
        return [decode(row[0]) for row in rows]

    @staticmethod
    def page(buffer_id: int, last: int | None, before: int | None) -> Program[HistoryPage]:
        sql = "SELECT pos, body FROM messages WHERE buffer_id = ?"
        params: list[Any] = [buffer_id]
        if before is not None:
            sql += " AND pos < ?"
            params.append(before)
        if last is None:
            rows = yield (sql + " ORDER BY pos", params)
            more = False
        else:
            rows = yield (sql + " ORDER BY pos DESC LIMIT ?", [*params, last + 1])
            more = len(rows) > last
            rows = list(reversed(rows[:last]))
        positions = [int(row[0]) for row in rows]
        return HistoryPage([decode(row[1]) for row in rows], positions,
                           positions[0] if more and positions else None)

    # -- the administrative path (MEM-15) ----------------------------------------
    def edit_entry(self, buffer_id: int, position: int,
                   message: Message | None) -> Program[bool]:
        """Replace or delete one entry (decided by :func:`~flowmem.entries.edit_entries`),
        then derive the indexes again: O(length), the administrative path only."""
        rows = yield ("SELECT pos, body FROM messages WHERE buffer_id = ? ORDER BY pos",
                      (buffer_id,))
        edited = edit_entries([(int(pos), decode(body)) for pos, body in rows], position, message)
        if edited is None:
            return False
        for table in ("messages", "calls", "pending"):
            yield (f"DELETE FROM {table} WHERE buffer_id = ?", (buffer_id,))
        yield from self._rewrite(buffer_id, edited)
        return True

    @staticmethod
    def _rewrite(buffer_id: int, entries: list[tuple[int, Message]]) -> Program[None]:
        indexes = derive_indexes(entries)
        owner = {spots[0]: call for call, spots in indexes.results.items()}
        for pos, message in entries:
            answered = owner.get(pos)
            healed = int(answered is not None and is_healed(message))
            yield ("INSERT INTO messages (buffer_id, pos, role, result_id, healed, body) "
                   "VALUES (?, ?, ?, ?, ?, ?)",
                   (buffer_id, pos, message["role"], answered, healed, encode(message)))
        for call, turns in indexes.calls.items():
            for turn, order in turns:
                yield ("INSERT INTO calls (buffer_id, call_id, turn_pos, ord) "
                       "VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                       (buffer_id, call, turn, order))
        for pending in indexes.pending:
            yield ("INSERT INTO pending (buffer_id, call_id, turn_pos, ord) VALUES (?, ?, ?, ?)",
                   (buffer_id, pending.call_id, pending.turn, pending.order))
        yield ("UPDATE buffers SET count = ? WHERE id = ?", (len(entries), buffer_id))
