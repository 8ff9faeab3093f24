"""Row-per-message conversations in SQL, shared by the SQLite and PostgreSQL stores.

Tables (created by each backend's migrations)::

    kv(scope, scope_id, key, value)                      plain values
    buffers(id, scope, scope_id, key, count, next_pos, pending)
                                                         one row per conversation; pending:
                                                         its unanswered calls (JSON)
    messages(buffer_id, pos, role, result_id, healed, body)
        UNIQUE (buffer_id, pos)
        UNIQUE (buffer_id, result_id) WHERE result_id IS NOT NULL
    calls(buffer_id, call_id, turn_pos, ord)             every declaration (PostgreSQL)

SQLite (schema 7) keeps a conversation's count, next position and calls on its
newest message instead of its row (:mod:`flowmem.stores.sqlite._state`); the
programs name the state through :attr:`SQLConversations.buffer_row`,
``count_or_value`` and the :class:`~flowmem.stores.sql._apply.Saver` they pass.
Since schema 8 SQLite keeps a declaration that opens an unanswered call there
too, then on the message that answers it (``declared_at``, ``declared_ord``),
not in ``calls`` (:mod:`flowmem.stores.sql._declarations`).

PostgreSQL names a conversation by its key instead of its names
(:mod:`flowmem.stores.postgres._programs` overrides the statements that find
one, and the idempotency statements, which take the operation's ``key``).

Every statement an append runs is an indexed look-up or a bounded range scan;
none reads the whole conversation. A result is written with one upsert on
the (buffer, result id) unique key, so even two unserialized writers cannot
store a result twice (MEM-1), and a real result overwrites only a healed
placeholder, in place (MEM-10). An append reads the buffer's row and the
planner's view in one batch and applies its plan in another (two round trips
on PostgreSQL, with ``BEGIN`` and ``COMMIT``). All the rule decisions come from
:func:`flowmem.plan.plan_append`; this module only executes them.

Sans-I/O: every operation is a *program*, a generator that yields a
statement (or a :class:`~flowmem.stores.sql._program.Batch` of them) and
receives the rows (:mod:`flowmem.stores.sql._program`). The same program runs
on a blocking connection (:func:`drive`: SQLite, psycopg) and on an asyncio
one (:func:`adrive`: psycopg's async connection), so the SQL conversation
logic exists once for both faces of the coordinator. Applying a plan is
:mod:`flowmem.stores.sql._apply`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from ...entries import derive_indexes, edit_entries
from ...errors import KeyConflict
from ...ids import is_healed
from ...messages import Message
from ...plan import AppendPlan, BufferView, PendingCall, mentioned_ids, plan_append
from ...retention import Expiry
from ...scopes import StorageKey
from ...store import AppendOutcome, DeleteOutcome, HistoryPage, Idempotency, plan_stats
from .._codec import decode, decode_all, encode
from .._conflicts import conversation_conflict
from ._apply import Applied, PendingInRow, Then, apply_plan
from ._erasure import SQLErasure, split
from ._expiry import SQLExpiry
from ._idempotency import IdempotencyRecords
from ._per_turn import per_turn_parts
from ._program import (
    AsyncExecute,
    Batch,
    Execute,
    Program,
    Rows,
    Statement,
    T,
    adrive,
    drive,
    resumed,
)
from ._reads import BUFFER_BY_KEY as _BUFFER_ID
from ._reads import Reads
from ._view import view_from, view_parts

__all__ = [
    "AsyncExecute",
    "Batch",
    "Execute",
    "Program",
    "SQLConversations",
    "T",
    "adrive",
    "drive",
]

_BUFFER_ROW: Final = ("SELECT id, count, next_pos, pending FROM buffers "
                      "WHERE scope = ? AND scope_id = ? AND key = ?")
_NEW_BUFFER: Final = ("INSERT INTO buffers (scope, scope_id, key) VALUES (?, ?, ?) "
                      "ON CONFLICT (scope, scope_id, key) DO NOTHING")


def prefix_end(prefix: str) -> str | None:
    """The least string above every string that starts with ``prefix`` (by code point),
    or ``None`` when there is none (``""``, or a prefix of U+10FFFF only)."""
    stem = prefix.rstrip("\U0010ffff")
    if not stem:
        return None
    following = ord(stem[-1]) + 1
    if 0xD800 <= following <= 0xDFFF:  # no surrogate is a key's character
        following = 0xE000
    return stem[:-1] + chr(following)


class SQLConversations(IdempotencyRecords, Reads, SQLExpiry, SQLErasure):
    """The SQL programs of every store operation (sans-I/O: see the module notes).

    ``lock_row`` is appended to the statements that read a buffer's row
    inside a writing transaction (``" FOR UPDATE"`` on PostgreSQL, ``""`` on
    SQLite whose ``BEGIN IMMEDIATE`` already holds the write lock).
    """

    index_tables: tuple[str, ...] = ("messages", "calls")  # a buffer's other rows
    buffer_row: str = _BUFFER_ROW
    """A key's buffer: ``(id, count, next position, pending)`` (parameters: the key)."""

    def __init__(self, *, lock_row: str = "") -> None:
        self.lock_row = lock_row

    # -- store operations: one program each, run inside one transaction ---------
    def read(self, key: StorageKey) -> Program[tuple[bool, Any]]:
        """The value, or the conversation's messages, in ONE batch (on PostgreSQL one round
        trip with ``BEGIN`` and ``COMMIT``: the service reads its changes record so)."""
        where = (key.scope, key.scope_id, key.key)
        value, buffer, rows = yield Batch((
            ("SELECT value FROM kv WHERE scope = ? AND scope_id = ? AND key = ?", where),
            ("SELECT id FROM buffers WHERE scope = ? AND scope_id = ? AND key = ?", where),
            self.page_statement(_BUFFER_ID, where, None, None)), final=True)
        if value:
            return True, decode(value[0][0])
        if not buffer:
            return False, None
        return True, decode_all(self.page_from(rows, None).encoded or [])

    def write(self, key: StorageKey, text: str, idempotency: Idempotency | None = None,
              replace: bool = False, expiry: Expiry | None = None) -> Program[bool]:
        """Whether it replayed an earlier write under ``idempotency`` (nothing changed).
        ``expiry``: the key's expired data is dropped first, the value's expiry set last."""
        if expiry is not None:
            yield Batch(tuple(self.purge_statements(key, expiry.now)))
        return (yield from self._write(key, text, idempotency, replace, expiry))

    def _write(self, key: StorageKey, text: str, idempotency: Idempotency | None,
               replace: bool, expiry: Expiry | None) -> Program[bool]:
        if idempotency is not None and (yield from self.claim(idempotency, key)) is not None:
            return True
        buffer_id = yield from self.buffer_id(key, lock=True)
        if buffer_id is not None:
            if not replace:  # raised before any change: the transaction rolls back
                raise conversation_conflict(key)
            yield from self.drop_buffer(buffer_id)
        yield from self.check_fence(key)  # an identity scope under erasure: refused
        yield from self.store_value(key, text)
        if expiry is not None:  # before the record, whose batch may carry the COMMIT
            yield self.value_expiry(key, expiry)
        if idempotency is not None:
            yield from self.record(idempotency, {}, key)
        return False

    def store_value(self, key: StorageKey, text: str) -> Program[None]:
        """Insert or replace the value row of ``key`` (a backend keys it its own way)."""
        yield ("INSERT INTO kv (scope, scope_id, key, value) VALUES (?, ?, ?, ?) "
               "ON CONFLICT (scope, scope_id, key) DO UPDATE SET value = excluded.value",
               (key.scope, key.scope_id, key.key, text))

    def delete(self, key: StorageKey,
               idempotency: Idempotency | None = None) -> Program[DeleteOutcome]:
        """Whether the key held anything; a repeat under ``idempotency`` replays the first
        answer, decided by the claim in this same transaction."""
        if idempotency is not None:
            first = yield from self.claim(idempotency, key)
            if first is not None:
                return DeleteOutcome(bool(first["found"]), replayed=True)
        found = yield from self.drop_value(key)
        buffer_id = yield from self.buffer_id(key, lock=True)
        if buffer_id is not None:
            yield from self.drop_buffer(buffer_id)
            found = True
        if idempotency is not None:
            yield from self.record(idempotency, {"found": found}, key)
        return DeleteOutcome(found)

    def append(self, key: StorageKey, incoming: Sequence[Message],
               max_messages: int | None, serialized: bool,
               idempotency: Idempotency | None = None, tail: int = 0,
               opening: Program[tuple[int, int, int, BufferView]] | None = None,
               expiry: Expiry | None = None) -> Program[AppendOutcome]:
        """Plan (:func:`~flowmem.plan.plan_append`) against indexed look-ups, then apply
        (:func:`~flowmem.stores.sql._apply.apply_plan`: the last step, with the record of
        the idempotency key and, with ``tail``, the page of the newest ``tail`` entries).

        ``opening``: the rest of :meth:`open_and_view`, when a driver took its first
        steps itself (SQLite's short path, :mod:`.sqlite_fast`; no idempotency key).
        ``expiry``: the key's expired data is dropped in the first batch (before the claim),
        the conversation's expiry set in the last one: no round trip of their own."""
        opened = self.open_and_view(key, incoming) if opening is None else opening
        purge = [] if expiry is None else self.purge_statements(key, expiry.now)
        if idempotency is not None or purge:  # both go with the first step of opening
            step = next(opened)
            steps = step.statements if isinstance(step, Batch) else (step,)
            claims = () if idempotency is None else self.claim_statements(idempotency, key)
            answers = (yield Batch((*purge, *claims, *steps)))[len(purge):]
            if idempotency is not None:
                claim, record, *answers = answers
                first = self.claimed(idempotency, claim, record)
                if first is not None:
                    opened.close()
                    page = (yield from self.history(key, tail, None)) if tail else None
                    return AppendOutcome(first["count"], first["appended"], serialized,
                                         replayed=True, tail=page)
            opened = resumed(opened, answers if isinstance(step, Batch) else answers[0])
        buffer_id, count, next_pos, view = yield from opened
        plan = plan_append(view, incoming)

        def then(count: int, appended: int) -> list[Statement]:
            closing = ([] if idempotency is None else
                       self.record_statements(idempotency, {"count": count, "appended": appended},
                                              key))
            if expiry is not None:
                closing.append(self.buffer_expiry(buffer_id, expiry))
            if tail:  # read last, after the window's deletes: what the append left
                closing += self.tail_statements(buffer_id, tail)
            return closing

        count, appended, rows = yield from self.apply(buffer_id, count, next_pos, plan,
                                                      max_messages, then, view)
        page = self.tail_from(rows, tail, count) if tail else None
        return AppendOutcome(count, appended, serialized, plan_stats(plan), tail=page)

    def tail_statements(self, buffer_id: int, tail: int) -> list[Statement]:
        """The statements reading an append's tail, last in its final batch (a backend
        that knows the tail already sends none)."""
        return [self.page_statement("?", (buffer_id,), tail, None)]

    def tail_from(self, rows: list[Rows], tail: int, count: int) -> HistoryPage:
        """The tail :meth:`tail_statements` read (the last of ``rows``)."""
        return self.as_page(rows[-1], tail, count)

    def apply(self, buffer_id: int, count: int, next_pos: int, plan: AppendPlan,
              max_messages: int | None, then: Then, view: BufferView) -> Program[Applied]:
        """Execute ``plan``, planned on ``view``
        (:func:`~flowmem.stores.sql._apply.apply_plan`); a backend that keeps a copy of the
        view learns what the plan did here."""
        return (yield from apply_plan(buffer_id, count, next_pos, plan, max_messages, then,
                                      PendingInRow.of(view.pending)))

    def edit(self, key: StorageKey, position: int, message: Message | None) -> Program[bool]:
        buffer_id = yield from self.buffer_id(key, lock=True)
        if buffer_id is None:
            return False
        return (yield from self.edit_entry(buffer_id, position, message))

    def keys(self, scope: str, scope_id: str, prefix: str, after: str | None,
             limit: int, now: float | None = None) -> Program[list[str]]:
        """Value and conversation keys under one scope id, by code point, paged by ``after``
        (with ``now``: the live ones)."""
        low = max(prefix, after) if after is not None else prefix
        end = prefix_end(prefix)  # None: no bound above (the whole code-point range)
        live, at = self.keys_filter(now)
        query = ("SELECT key FROM {t} WHERE scope = ? AND scope_id = ? AND key >= ? "
                 + ("" if end is None else "AND key < ? ") + live + "AND key <> ?")
        params: tuple[Any, ...] = (scope, scope_id, low, *(() if end is None else (end,)),
                                   *at, after or "")
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
        select = self.buffer_row + self.lock_row
        rows = yield (select, where)
        if not rows:
            if (yield ("SELECT 1 FROM kv WHERE scope = ? AND scope_id = ? AND key = ?", where)):
                raise KeyConflict(f"key {key.key!r} holds a plain value, not a conversation")
            yield from self.check_fence(key)
            yield (_NEW_BUFFER, where)
            rows = yield (select, where)
        return int(rows[0][0]), int(rows[0][1]), int(rows[0][2])

    def drop_buffer(self, buffer_id: int) -> Program[None]:
        for table in self.index_tables:
            yield (f"DELETE FROM {table} WHERE buffer_id = ?", (buffer_id,))
        yield ("DELETE FROM buffers WHERE id = ?", (buffer_id,))

    # -- the planner's view ---------------------------------------------------
    def open_and_view(self, key: StorageKey,
                      incoming: Sequence[Message]) -> Program[tuple[int, int, int, BufferView]]:
        """``(id, count, next_pos)`` of the key's buffer, row-locked, and the planner's view.

        One batch: the row, then the view, which names the buffer by a subquery on
        its key. Each statement reads after the one before it (on PostgreSQL, in
        ``READ COMMITTED``, each takes its snapshot when it runs: after the row
        lock was granted), so the view is authoritative under the lock. A new
        buffer takes a second batch: refused when the key holds a value (the
        insert is rolled back with the error), else inserted, locked and viewed.
        """
        where = (key.scope, key.scope_id, key.key)
        view = self._view_statements(key, incoming)
        select = self.buffer_row + self.lock_row
        row, *view_rows = yield Batch(((select, where), *view))
        if not row:  # a new buffer: refused under an erasure's fence (rolled back)
            fence = self.fence_statements(key)
            fenced, (value, _, row, *view_rows) = split((yield Batch((
                *fence, ("SELECT 1 FROM kv WHERE scope = ? AND scope_id = ? AND key = ?", where),
                (_NEW_BUFFER, where), (select, where), *view))), len(fence))
            self.fenced(key, fenced)
            if value:
                raise KeyConflict(f"key {key.key!r} holds a plain value, not a conversation")
        buffer_id, count, next_pos, pending = row[0]
        return (int(buffer_id), int(count), int(next_pos),
                view_from(view_rows[0] if view_rows else [], PendingInRow.decode(pending),
                          incoming))

    @staticmethod
    def _view_statements(key: StorageKey, incoming: Sequence[Message]) -> list[Statement]:
        """The planner's view in (at most) one statement: results and declarations of the
        ids ``incoming`` mentions (indexed look-ups)."""
        where = (key.scope, key.scope_id, key.key)
        parts, params = view_parts(_BUFFER_ID, where, sorted(mentioned_ids(incoming)))
        more, more_params = per_turn_parts(_BUFFER_ID, where, incoming)
        parts, params = parts + more, params + more_params
        return [(" UNION ALL ".join(parts), params)] if parts else []

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
        next_pos = yield from self.next_position(buffer_id)
        for table in self.index_tables:
            yield (f"DELETE FROM {table} WHERE buffer_id = ?", (buffer_id,))
        yield from self._rewrite(buffer_id, edited, next_pos)
        return True

    def next_position(self, buffer_id: int) -> Program[int | None]:
        """What an edit reads of the buffer's next position before it rewrites the
        entries: nothing where the row keeps it (``None``; SQLite reads it: it is kept
        on the newest entry, :mod:`.sqlite_head`)."""
        yield from ()
        return None

    def _rewrite(self, buffer_id: int, entries: list[tuple[int, Message]],
                 next_pos: int | None) -> Program[None]:
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
        yield from self.save_rewritten(buffer_id, len(entries), indexes.pending, next_pos)

    def save_rewritten(self, buffer_id: int, count: int, pending: Sequence[PendingCall],
                       next_pos: int | None) -> Program[None]:
        """The unanswered calls and the count of a rewritten buffer (``next_pos``: what
        :meth:`next_position` read)."""
        yield ("UPDATE buffers SET count = ?, pending = ? WHERE id = ?",
               (count, PendingInRow.of(pending).encode(), buffer_id))
