"""SQLite's variant of the shared SQL programs: one statement for the view, none when hot.

The shared program (:mod:`flowmem.stores.sql`) reads the buffer's row
(``FOR UPDATE`` on PostgreSQL) and then the planner's view, as one batch
that PostgreSQL sends in one round trip. SQLite has no round trips to save
but pays per statement; under its ``BEGIN IMMEDIATE`` the write lock is
already held, so the row and the view are ONE statement here: a CTE names
the buffer and every part of the view looks it up by that subquery.

A connection's programs also keep its hot buffers (:mod:`.sqlite_hot`): when
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

from ..errors import StoreError
from ..messages import Message
from ..pages import UNPARSED
from ..plan import AppendPlan, BufferView, PendingCall, mentioned_ids
from ..scopes import StorageKey
from ..store import HistoryPage
from .sql import Program, SQLConversations, decode, view_parts, view_sets
from .sql_apply import Applied, PendingInRow, Then, apply_plan
from .sql_declarations import with_pending
from .sql_program import Batch, Rows, Statement
from .sqlite_head import (
    BUFFER_ROW,
    COUNT_OR_VALUE,
    NEXT_OF,
    ON_NEWEST,
    PENDING,
    PENDING_OF,
    STATE_OF,
    VERSION,
)
from .sqlite_hot import HotBuffer, HotBuffers, adds_only

__all__ = ["DATA_VERSION", "RESULTS_BY_ID", "VERSION", "SQLiteConversations", "hot_tail",
           "learned"]

_BUFFER_ROW: Final = ("WITH b (id, count, next_pos, pending, version) AS "
                      f"({STATE_OF}) SELECT 3, id, count, next_pos FROM b "
                      "UNION ALL SELECT 4, pending, version, 0 FROM b")
CALLS_AT_START: Final = 64
"""The most ``calls`` rows a new hot copy reads (schema 8: only the declarations that
opened nothing have one; most buffers have none). A copy that read them all knows every
declaration but those its results carry, so it learns an id by the results' key alone."""
DATA_VERSION: Final = ("PRAGMA data_version", ())
"""The statement telling whether another connection committed (:mod:`.sqlite_hot`)."""
RESULTS_BY_ID: Final = "messages INDEXED BY messages_result"
"""The MEM-1 results, read by id. Named, because SQLite's planner, without statistics
(flowmem never runs ``ANALYZE``), takes the buffer's positions for three ids or more and
scans the whole conversation: 23 ms at 100,000 entries instead of 20 µs."""
_CALL_ROWS: Final = (" UNION ALL SELECT 5, c.call_id, m.healed, m.result_id IS NOT NULL FROM "
                     "(SELECT call_id FROM calls WHERE buffer_id = (SELECT id FROM b) "
                     f"LIMIT {CALLS_AT_START + 1}) AS c "
                     "LEFT JOIN messages AS m INDEXED BY messages_result "
                     "ON m.buffer_id = (SELECT id FROM b) AND m.result_id = c.call_id")
"""The ``calls`` rows a new copy reads, each with its id's stored result if any
(``healed`` and whether there is one), so that the copy knows every fact of those ids:
what it knows of an id is all of it or nothing (the short path and the program learn
the same ids, :mod:`.sqlite_fast`)."""
ANSWERS: Final = "declared_at IS NOT NULL"
"""Whether a result carries the declaration it answers (schema 8: its id is declared)."""
# A fill reads the ids of two indexes (every result; the marked ones: placeholders and
# results that carry no declaration, schema 8) and of the calls' key, never a message's
# body; each list aggregated by SQLite into one text, the ids joined by commas (SQLite's
# default separator: 3.4 M instructions for 4,200 ids, against 6.3 M with any other
# separator and 5.4 M for a JSON array), with its count to check the split by; a fill
# whose split does not match (an id holding a comma: no provider's does) is read again
# a row per id. The declared ids are the calls' key's, the results' less those carrying
# none, and the unanswered calls (sql_declarations.py).
_RESULT_IDS: Final = ("FROM messages INDEXED BY messages_result "
                      "WHERE buffer_id = ? AND result_id IS NOT NULL")
_MARKED: Final = ("FROM messages INDEXED BY messages_marked WHERE buffer_id = ? "
                  "AND (healed = 1 OR (result_id IS NOT NULL AND declared_at IS NULL))")
"""The partial index's own condition, so that SQLite may use it."""
_PLACEHOLDER_IDS: Final = f"{_MARKED} AND healed = 1"
_UNDECLARED_IDS: Final = f"{_MARKED} AND declared_at IS NULL"
_ID_LISTS: Final = (("result_id", _RESULT_IDS), ("result_id", _PLACEHOLDER_IDS),
                    ("call_id", "FROM calls WHERE buffer_id = ?"),
                    ("result_id", _UNDECLARED_IDS))
_FILL_JOINED: Final = " UNION ALL ".join(
    [f"SELECT {kind}, group_concat({column}), count(*) {where}"
     for kind, (column, where) in enumerate(_ID_LISTS)]
    + [f"SELECT 4, ({PENDING_OF}), 0"])
_FILL_ROWS: Final = " UNION ALL ".join(
    [f"SELECT {kind}, {column} {where}" for kind, (column, where) in enumerate(_ID_LISTS)]
    + [f"SELECT 4, {PENDING} FROM buffers AS b WHERE b.id = ?"])
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
    newest entry and written there (:mod:`.sqlite_head`).
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
            return read.buffer_id, read.count, read.next_pos, read.view()
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
        self.hot.stale(names)
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
                yield from self.learn(names, buffer, unknown)
        self._target = (names, buffer)
        return buffer.buffer_id, buffer.count, buffer.next_pos, buffer.view()

    def learn(self, names: tuple[str, str, str], buffer: HotBuffer,
              unknown: list[str]) -> Program[bool]:
        """Teach the partial copy ``buffer`` the ``unknown`` ids an append mentions: read
        their view (:meth:`learning`), or fill the copy when the reads have paid for it
        (``should_fill``: rent, then buy). Returns whether any of them is held: has a
        stored result or was declared (else a plan that took them all as new stands)."""
        view = self.learning(names, buffer, unknown)
        if view is None:
            return (yield from self.filled(buffer, unknown))
        return learned(buffer, unknown, (yield view))

    def filled(self, buffer: HotBuffer, unknown: list[str]) -> Program[bool]:
        """:meth:`learn` by a fill: whether any of the ``unknown`` ids is held."""
        yield from self._fill(buffer)
        return buffer.holds_any(unknown)

    def learning(self, names: tuple[str, str, str], buffer: HotBuffer,
                 unknown: list[str]) -> Statement | None:
        """The statement reading the view of the ``unknown`` ids (sorted here), or ``None``
        when this read fills the copy instead (:meth:`learn`; the short path runs both by
        plain calls, :mod:`.sqlite_fast`)."""
        assert self.hot is not None
        if self.hot.should_fill(names, buffer.count):
            return None
        unknown.sort()
        view = view_by_id("?", (buffer.buffer_id,), unknown, calls=not buffer.calls_known)
        assert view is not None  # an append learns only ids it does not know
        return view

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
        rows = yield _with_view(_BUFFER_ROW + _CALL_ROWS, [key.scope, key.scope_id, key.key],
                                view_by_id("(SELECT id FROM b)", (), sorted(ids)))
        head = [row for row in rows if row[0] == 3]
        if not head:  # a new buffer (or a value: open_buffer refuses it); nothing to view
            return HotBuffer(*(yield from self.open_buffer(key)))
        _, buffer_id, count, next_pos = head[0]
        _, text, version, _ = next(row for row in rows if row[0] == 4)
        pending = {call.call_id: call for call in PendingInRow.decode(text).as_calls()}
        results, declared = view_sets([row for row in rows if row[0] < 3])
        call_rows = [row for row in rows if row[0] == 5]
        for _, call, healed, stored in call_rows:
            declared.add(call)
            if stored:
                results[call] = bool(healed)
        ids.update(row[1] for row in call_rows)
        # an unanswered call's facts are known too: declared (MEM-2), and no result
        return HotBuffer(int(buffer_id), int(count), int(next_pos), results,
                         with_pending(declared, pending), pending, version=int(version),
                         known=ids.union(pending),
                         calls_known=len(call_rows) <= CALLS_AT_START)

    @staticmethod
    def _fill(buffer: HotBuffer) -> Program[None]:
        """Make ``buffer`` complete: every result, declaration and unanswered call."""
        params = (buffer.buffer_id,) * 5
        ids: list[list[str]] = [[], [], [], []]
        pending = "{}"
        for kind, joined, count in (yield (_FILL_JOINED, params)):
            if kind == 4:
                pending = joined
            elif joined is not None:
                ids[kind] = joined.split(",")
                if len(ids[kind]) != count:  # an id holding a comma: read a row per id
                    ids, pending = yield from _fill_by_rows(params)
                    break
        results = dict.fromkeys(ids[0], False)
        results.update(dict.fromkeys(ids[1], True))
        calls = {p.call_id: p for p in PendingInRow.decode(pending).as_calls()}
        declared = set(results)
        declared.difference_update(ids[3])
        declared.update(ids[2])
        buffer.fill(results, with_pending(declared, calls), calls)

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


def learned(buffer: HotBuffer, unknown: list[str], rows: Rows) -> bool:
    """What :meth:`SQLiteConversations.learning`'s statement answered, taught to the copy:
    whether any of the ``unknown`` ids is held (a row is a stored result or a
    declaration)."""
    buffer.learn(unknown, *view_sets(rows))
    return bool(rows)


BY_ID_AT_MOST: Final = 16
"""The most ids :func:`view_by_id` looks up one by one; more are read with ``IN`` lists
(a compound statement may have at most 500 parts)."""


def view_by_id(buffer: str, buffer_params: Sequence[Any], ids: Sequence[str], *,
               calls: bool = True) -> Statement | None:
    """The planner's view of ``ids`` (:func:`~flowmem.stores.sql.view_parts`' rows: the
    MEM-1 results and the MEM-2 declarations of those ids) as ONE statement, or ``None``
    for no id.

    Up to :data:`BY_ID_AT_MOST` ids, each is its own equality seek of the two keys,
    joined by ``UNION ALL``: an ``IN`` list costs SQLite an ephemeral table per list,
    built and zeroed per statement (two new call ids, inside a transaction: 105,995
    instructions with the lists, 38,152 by seeks; docs/benchmarks-hotpath.md).
    ``calls=False`` leaves the calls' key out (seeks of the results' key only), for a
    hot copy that knows every ``calls`` row of its buffer (:data:`CALLS_AT_START`)."""
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
    return _seeks(buffer, len(ids), calls), seeks + seeks if calls else seeks


@lru_cache(maxsize=4 * BY_ID_AT_MOST)
def _seeks(buffer: str, count: int, calls: bool) -> str:
    results = (f"SELECT 0, result_id, healed, {ANSWERS} FROM {RESULTS_BY_ID} "
               f"WHERE buffer_id = {buffer} AND result_id = ?")
    call = f"SELECT 1, call_id, 0, 0 FROM calls WHERE buffer_id = {buffer} AND call_id = ?"
    return " UNION ALL ".join([results] * count + [call] * count * calls)


def _with_view(first: str, params: list[Any], view: Statement | None) -> Statement:
    """``first`` and the view's statement as one (``UNION ALL``)."""
    if view is None:
        return first, params
    return f"{first} UNION ALL {view[0]}", [*params, *view[1]]


def _fill_by_rows(params: tuple[int, ...]) -> Program[tuple[list[list[str]], str]]:
    """A fill's four id lists and the unanswered calls' text, a row per id."""
    ids: list[list[str]] = [[], [], [], []]
    pending = "{}"
    for kind, value in (yield (_FILL_ROWS, params)):
        if kind == 4:
            pending = value
        else:
            ids[kind].append(value)
    return ids, pending


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
