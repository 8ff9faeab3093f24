"""SQLite's variant of the shared SQL programs: one statement for the view, none when hot.

The shared program (:mod:`flowmem.stores.sql._conversations`) reads the buffer's row
(``FOR UPDATE`` on PostgreSQL) and then the planner's view, as one batch
that PostgreSQL sends in one round trip. SQLite has no round trips to save
but pays per statement; under its ``BEGIN IMMEDIATE`` the write lock is
already held, so the row and the view are ONE statement here: a CTE names
the buffer and every part of the view looks it up by that subquery.

A connection's programs also keep its hot buffers (:mod:`._view_cache`): when
no other connection has committed since, the common append reads no view at
all (``PRAGMA data_version`` only) and plans against the connection's own
copy; a copy that does not yet know an id the append mentions reads the view
of that id alone. The rows and the plan are the same either way; only the
reads change.

A page of history is read as ONE row (:meth:`SQLiteConversations.page_statement`): the
positions and the bodies aggregated into two texts by SQLite (the bodies'
texts are kept on the page, for a server to send on as they are). Python's
driver lets go of the GIL for every row it steps to and must win it back
before the next, so in a busy server (an event loop holding the GIL) a
fifty-row page queued fifty waits on the connection thread; one row waits once.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Final

from ...errors import StoreError
from ...messages import Message
from ...pages import UNPARSED
from ...plan import AppendPlan, BufferView, PendingCall, mentioned_ids
from ...scopes import StorageKey
from ...store import HistoryPage
from .._codec import decode
from ..sql._apply import Applied, PendingInRow, Then, apply_plan
from ..sql._conversations import Program, SQLConversations
from ..sql._declarations import with_pending
from ..sql._per_turn import per_turn_facts, per_turn_parts, with_facts
from ..sql._program import Batch, Rows, Statement
from ..sql._view import view_parts, view_sets
from ._state import (
    BUFFER_ROW,
    COUNT_OR_VALUE,
    NEXT_OF,
    ON_NEWEST,
    STATE_OF,
    VERSION,
)
from ._view_cache import HotBuffer, HotBuffers, adds_only

__all__ = ["DATA_VERSION", "RESULTS_BY_ID", "VERSION", "SQLiteConversations", "hot_tail",
           "learned", "learning", "per_turn_statement", "per_turn_view"]

_BUFFER_ROW: Final = ("WITH b (id, count, next_pos, pending, version) AS "
                      f"({STATE_OF}) SELECT 3, id, count, next_pos FROM b "
                      "UNION ALL SELECT 4, pending, version, 0 FROM b")
DATA_VERSION: Final = ("PRAGMA data_version", ())
"""The statement telling whether another connection committed (:mod:`._view_cache`)."""
RESULTS_BY_ID: Final = "messages INDEXED BY messages_result"
"""The MEM-1 results, read by id. Named, because SQLite's planner, without statistics
(flowmem never runs ``ANALYZE``), takes the buffer's positions for three ids or more and
scans the whole conversation: 23 ms at 100,000 entries instead of 20 µs."""
ANSWERS: Final = "declared_at IS NOT NULL"
"""Whether a result carries the declaration it answers (then its id is declared)."""
# JSON text never holds a raw control character (an encoder escapes them all), so
# the record separator cannot occur inside a body: it splits the aggregate exactly.
_SEPARATOR: Final = "\x1e"
_PAGE: Final = ("SELECT group_concat(pos), group_concat(body, char(30)) FROM "
                "(SELECT pos, body FROM messages WHERE buffer_id = {buffer}{before} "
                "ORDER BY pos{last})")

Opened = tuple[int, int, int, BufferView]


class SQLiteConversations(SQLConversations):
    """The shared programs, with :meth:`open_and_view` in one statement (or none).

    ``hot`` is the hot-buffer copy of the ONE connection these programs run
    on (``None``: always read the view). The buffer's state is read from its
    newest entry and written there (:mod:`._state`).
    """

    buffer_row = BUFFER_ROW
    count_or_value = COUNT_OR_VALUE

    def __init__(self, hot: HotBuffers | None = None) -> None:
        super().__init__()
        self.hot = hot
        self._target: tuple[tuple[str, str, str], HotBuffer] | None = None
        self._applying: HotBuffer | None = None  # the hot buffer of the append under way
        self._tail_known = False  # whether its tail comes from the hot copy

    def forget_hot(self, key: StorageKey | None = None) -> None:
        """Drop the hot copy of ``key`` (a write, delete or edit of it), or all of them
        (the transaction, or a savepoint of it, was rolled back)."""
        self._target = self._applying = None
        self._tail_known = False
        if self.hot is not None:
            if key is None:
                self.hot.clear()
            else:
                self.hot.drop((key.scope, key.scope_id, key.key))

    def open_and_view(self, key: StorageKey,
                      incoming: Sequence[Message]) -> Program[Opened]:
        self._target = None
        hot = self.hot
        if hot is None:
            read = yield from self._indexed(key, incoming)
            view = yield from self._per_turn(read, incoming)
            return read.buffer_id, read.count, read.next_pos, view
        names = (key.scope, key.scope_id, key.key)
        hot.observe(int((yield DATA_VERSION)[0][0]))
        buffer = hot.get(names)
        if buffer is not None and not hot.current(buffer):  # another connection committed
            buffer = self.checked(names, buffer, (yield (VERSION, (buffer.buffer_id,))))
        return (yield from self.opened(key, incoming, buffer))

    def checked(self, names: tuple[str, str, str], buffer: HotBuffer,
                row: Rows) -> HotBuffer | None:
        """``buffer`` when its state's version (``row``: :data:`VERSION`'s answer) is the
        copy's (the other connection's commit touched other buffers), else ``None``."""
        assert self.hot is not None
        if row and int(row[0][0]) == buffer.version:
            buffer.checked = self.hot.version
            return buffer
        self.hot.drop(names)
        return None

    def opened(self, key: StorageKey, incoming: Sequence[Message],
               buffer: HotBuffer | None) -> Program[Opened]:
        """The rest of :meth:`open_and_view` once ``PRAGMA data_version`` (and the
        version check) decided the hot copy: ``buffer``, or ``None`` to start one from
        the buffer's row and the view of the ids ``incoming`` mentions."""
        assert self.hot is not None
        hot = self.hot
        names = (key.scope, key.scope_id, key.key)
        if buffer is None:
            buffer = hot.keep(names, (yield from self._indexed(key, incoming)))
            buffer.checked = hot.version
        else:
            unknown = buffer.unknown(mentioned_ids(incoming))
            if unknown:
                yield from self.learn(buffer, unknown)
        self._target = (names, buffer)
        view = yield from self._per_turn(buffer, incoming)
        return buffer.buffer_id, buffer.count, buffer.next_pos, view

    @staticmethod
    def _per_turn(buffer: HotBuffer, incoming: Sequence[Message]) -> Program[BufferView]:
        """``buffer``'s view, with the facts a ``per_turn`` batch reads
        (:func:`per_turn_statement`)."""
        statement = per_turn_statement(buffer, incoming)
        if statement is None:
            return buffer.view()
        return per_turn_view(buffer, incoming, (yield statement))

    @staticmethod
    def learn(buffer: HotBuffer, unknown: list[str]) -> Program[bool]:
        """Teach the partial copy ``buffer`` the ``unknown`` ids an append mentions (read
        by id, :func:`learning`). Returns whether any of them is held: has a stored result
        or was declared (else a plan that took them all as new stands)."""
        return learned(buffer, unknown, (yield learning(buffer, unknown)))

    def apply(self, buffer_id: int, count: int, next_pos: int, plan: AppendPlan,
              max_messages: int | None, then: Then, view: BufferView) -> Program[Applied]:
        target, self._target = self._target, None
        # the hot copy's tail serves this append's only when the append just adds entries
        quiet = adds_only(plan, count, max_messages)
        self._applying = target[1] if target is not None and quiet else None
        self._tail_known = False
        added: list[tuple[int, str]] = []
        version = random.getrandbits(62)  # every change of a buffer gives its state a new one
        # the row was read (or known hot) under this transaction's write lock: no check
        done = yield from apply_plan(buffer_id, count, next_pos, plan, max_messages, then,
                                     PendingInRow.of(view.pending), ON_NEWEST, added,
                                     version)
        if target is not None and self.hot is not None:
            names, buffer = target
            if done[:2] == (count + plan.appended + plan.healed, plan.appended):
                buffer.apply(plan, done[0], added)
                buffer.version, buffer.checked = version, self.hot.version
            else:  # the window evicted (or a row was refused): read the view next time
                self.hot.drop(names)
                self._applying = None
        return done

    def tail_statements(self, buffer_id: int, tail: int) -> list[Statement]:
        """None when the hot copy knows the newest ``tail`` entries (as they will be after
        this append: it only appends, and the window leaves the copy unused)."""
        buffer = self._applying
        self._tail_known = buffer is not None and buffer.serves(tail)
        return [] if self._tail_known else super().tail_statements(buffer_id, tail)

    def tail_from(self, rows: list[Rows], tail: int, count: int) -> HistoryPage:
        buffer, self._applying = self._applying, None
        known, self._tail_known = self._tail_known, False
        if known:
            assert buffer is not None
            return hot_tail(buffer, tail, count)
        page = super().tail_from(rows, tail, count)
        if buffer is not None and buffer.count == count:
            buffer.learn_tail(page)
        return page

    def _indexed(self, key: StorageKey, incoming: Sequence[Message]) -> Program[HotBuffer]:
        """The buffer row and the view of the ids ``incoming`` mentions, in one statement:
        a copy that knows those ids (complete when the buffer is new)."""
        ids = mentioned_ids(incoming)
        rows = yield _with_view(_BUFFER_ROW, [key.scope, key.scope_id, key.key],
                                view_by_id("(SELECT id FROM b)", (), sorted(ids)))
        head = [row for row in rows if row[0] == 3]
        if not head:  # a new buffer (or a value: open_buffer refuses it); nothing to view
            return HotBuffer(*(yield from self.open_buffer(key)))
        _, buffer_id, count, next_pos = head[0]
        _, text, version, _ = next(row for row in rows if row[0] == 4)
        pending = {call.call_id: call for call in PendingInRow.decode(text).as_calls()}
        results, declared = view_sets([row for row in rows if row[0] < 3])
        # an unanswered call's facts are known too: declared (MEM-2), and no result
        return HotBuffer(int(buffer_id), int(count), int(next_pos), results,
                         with_pending(declared, pending), pending, version=int(version),
                         known=ids.union(pending))

    def next_position(self, buffer_id: int) -> Program[int | None]:
        rows = yield (NEXT_OF, (buffer_id,))
        return int(rows[0][0])

    def save_rewritten(self, buffer_id: int, count: int, pending: Sequence[PendingCall],
                       next_pos: int | None) -> Program[None]:
        assert next_pos is not None
        yield Batch(tuple(ON_NEWEST.saved(buffer_id, count, next_pos, PendingInRow.of(pending),
                                          random.getrandbits(62))))

    def read(self, key: StorageKey) -> Program[tuple[bool, Any]]:
        """The value, else the conversation: one statement when the key holds a value
        (SQLite pays per statement, not per round trip; the service reads its changes
        record so on every wave of requests)."""
        where = (key.scope, key.scope_id, key.key)
        rows = yield ("SELECT value FROM kv WHERE scope = ? AND scope_id = ? AND key = ?", where)
        if rows:
            return True, decode(rows[0][0])
        buffer_id = yield from self.buffer_id(key)
        if buffer_id is None:
            return False, None
        return True, (yield from self.messages(buffer_id))

    @staticmethod
    def messages(buffer_id: int) -> Program[list[Message]]:
        rows = yield SQLiteConversations.page_statement("?", (buffer_id,), None, None)
        return SQLiteConversations.page_from(rows, None).messages

    @staticmethod
    def page_statement(buffer: str, params: Sequence[Any], last: int | None,
                       before: int | None) -> Statement:
        """The shared page statement's rows, aggregated into one row of two texts."""
        sql = _PAGE.format(buffer=buffer, before="" if before is None else " AND pos < ?",
                           last="" if last is None else " DESC LIMIT ?")
        values = [*params, *(() if before is None else (before,)),
                  *(() if last is None else (last + 1,))]
        return sql, values

    @staticmethod
    def page_from(rows: Rows, last: int | None) -> HistoryPage:
        (positions_text, bodies_text), = rows
        if positions_text is None:
            return HistoryPage()
        positions, texts = oldest_first(json.loads(f"[{positions_text}]"),
                                        bodies_text.split(_SEPARATOR))
        more = last is not None and len(positions) > last
        if more:  # one more than asked was read, to know whether older entries exist
            del positions[0], texts[0]
        return HistoryPage(UNPARSED, positions, positions[0] if more and positions else None,
                           encoded=texts)


def learning(buffer: HotBuffer, unknown: list[str]) -> Statement:
    """The statement reading the view of the ``unknown`` ids (sorted here) of ``buffer``'s
    conversation (:meth:`SQLiteConversations.learn`; the short path runs it by a plain
    call, :mod:`._append`)."""
    unknown.sort()
    view = view_by_id("?", (buffer.buffer_id,), unknown)
    assert view is not None  # an append learns only ids it does not know
    return view


def per_turn_statement(buffer: HotBuffer, incoming: Sequence[Message]) -> Statement | None:
    """The statement reading what a ``per_turn`` batch's policy reads beyond the view
    (:func:`~flowmem.stores.sql._conversations.per_turn_parts`; ``None`` for another
    batch). Never kept by a hot copy: read by every such append, under its lock."""
    opened = {call.call_id: call.turn for call in buffer.pending.values()
              if isinstance(call.turn, int)}
    parts, params = per_turn_parts("?", (buffer.buffer_id,), incoming, results=RESULTS_BY_ID,
                                   defers=True, open_turns=opened)
    return (" UNION ALL ".join(parts), params) if parts else None


def per_turn_view(buffer: HotBuffer, incoming: Sequence[Message], rows: Rows) -> BufferView:
    """``buffer``'s view with the facts :func:`per_turn_statement` read; a partial copy
    learns the newest declarations' results (their ids are declared too)."""
    facts = per_turn_facts(rows, incoming)
    unknown = buffer.unknown(facts[2])
    if unknown:
        buffer.learn(unknown, {call: facts[2][call] for call in unknown}, set(unknown))
    return with_facts(buffer.view(), facts, merge=False)


def learned(buffer: HotBuffer, unknown: list[str], rows: Rows) -> bool:
    """What :func:`learning`'s statement answered, taught to the copy:
    whether any of the ``unknown`` ids is held (a row is a stored result or a
    declaration)."""
    buffer.learn(unknown, *view_sets(rows))
    return bool(rows)


BY_ID_AT_MOST: Final = 16
"""The most ids :func:`view_by_id` looks up one by one; more are read with ``IN`` lists
(a compound statement may have at most 500 parts)."""


def view_by_id(buffer: str, buffer_params: Sequence[Any],
               ids: Sequence[str]) -> Statement | None:
    """The planner's view of ``ids`` (:func:`~flowmem.stores.sql._conversations.view_parts`' rows:
    the MEM-1 results and the MEM-2 declarations of those ids) as ONE statement, or ``None``
    for no id.

    Up to :data:`BY_ID_AT_MOST` ids, each is its own equality seek of the two keys,
    joined by ``UNION ALL``: an ``IN`` list costs SQLite an ephemeral table per list,
    built and zeroed per statement (two new call ids, inside a transaction: 105,995
    instructions with the lists, 38,152 by seeks, measured once with callgrind)."""
    if not ids:
        return None
    if len(ids) > BY_ID_AT_MOST:
        parts, params = view_parts(buffer, buffer_params, ids, results=RESULTS_BY_ID,
                                   answers=ANSWERS)
        return " UNION ALL ".join(parts), params
    pair = [*buffer_params, None]
    seeks: list[Any] = []
    for call in ids:
        pair[-1] = call
        seeks += pair
    return _seeks(buffer, len(ids)), seeks + seeks


@lru_cache(maxsize=4 * BY_ID_AT_MOST)
def _seeks(buffer: str, count: int) -> str:
    results = (f"SELECT 0, result_id, healed, {ANSWERS} FROM {RESULTS_BY_ID} "
               f"WHERE buffer_id = {buffer} AND result_id = ?")
    call = f"SELECT 1, call_id, 0, 0 FROM calls WHERE buffer_id = {buffer} AND call_id = ?"
    return " UNION ALL ".join([results] * count + [call] * count)


def _with_view(first: str, params: list[Any], view: Statement | None) -> Statement:
    """``first`` and the view's statement as one (``UNION ALL``)."""
    if view is None:
        return first, params
    return f"{first} UNION ALL {view[0]}", [*params, *view[1]]


def hot_tail(buffer: HotBuffer, tail: int, count: int) -> HistoryPage:
    """The append's tail from the hot copy that was known to hold it (``count``: the
    buffer's count after the append)."""
    page = buffer.page(tail)
    if page is None or page.total != count:
        raise StoreError("the hot copy's tail does not match the append "
                         "(a broken invariant); nothing was stored")
    return page


def oldest_first(positions: list[int], bodies: list[Any]) -> tuple[list[int], list[Any]]:
    """The pairs ``(position, body)`` sorted by position. SQLite before 3.44 leaves the
    order an aggregate sees its rows in unspecified; both lists come from the SAME pass,
    so they pair up whatever that order is (in practice the subquery's)."""
    ascending = sorted(positions)
    if positions == ascending:
        return positions, bodies
    if positions[::-1] == ascending:
        return ascending, bodies[::-1]
    order = sorted(range(len(positions)), key=positions.__getitem__)
    return ascending, [bodies[i] for i in order]
