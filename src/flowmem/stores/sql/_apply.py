"""Applying an append plan in SQL: every statement known up front, sent as one batch.

An append is planned (:func:`flowmem.plan.plan_append`) against a view read
under the conversation's write lock (the buffer row ``FOR UPDATE`` on
PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite), so the view is authoritative and
the outcome of every statement of the plan is known before it runs: each
:class:`~flowmem.plan.AddEntry` takes the next position, each
:class:`~flowmem.plan.ReplacePlaceholder` overwrites a placeholder the view
holds. On the common path (no healing, no window to enforce) the whole
apply, the buffer's row and the idempotency record are ONE final
:class:`~flowmem.stores.sql._program.Batch` (PostgreSQL sends it with its
``COMMIT``: one round trip).

Every way a statement could differ from the plan is an error, never a silent
difference: an entry is a plain ``INSERT`` (the ``(buffer, pos)`` and
``(buffer, result id)`` unique keys refuse a position or a result the view
did not know, so a result is never stored twice, MEM-1), and a replacement
names the placeholder's own position, which is ``NULL`` — refused by
``NOT NULL`` — when no placeholder is there (MEM-10). The rows are checked
again after the batch (:class:`~flowmem.errors.StoreError`: a broken
invariant). The error aborts the transaction, so nothing of the append is
stored.

Healing (MEM-3) reads where each healed turn's block of results ends (one
round trip per healed turn, after the statements before it are sent) and the
window reads what it evicts (:func:`evict`: one round trip); the rest still
goes with the last batch.

Where a declaration is stored (MEM-2) is decided by the :class:`Saver`
(:attr:`Saver.defers`) and :mod:`.sql_declarations`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Final, Protocol

from ...errors import StoreError
from ...messages import healed_placeholder
from ...plan import SLOT, AddEntry, AppendPlan, HealTurn, NewTurn, PendingCall, ReplacePlaceholder
from .._codec import encode
from ._declarations import declarations_of, insert_calls, kept_declarations
from ._program import Batch, Program, Rows, Statement

__all__ = [
    "INSERT_ANSWER",
    "INSERT_ENTRY",
    "IN_ROW",
    "SAVE",
    "Applied",
    "PendingInRow",
    "RowSaver",
    "Saver",
    "add_statements",
    "apply_plan",
    "store_state",
]

INSERT_ENTRY: Final = ("INSERT INTO messages (buffer_id, pos, role, result_id, healed, body) "
                        "VALUES (?, ?, ?, ?, ?, ?)")
INSERT_ANSWER: Final = ("INSERT INTO messages (buffer_id, pos, role, result_id, healed, body, "
                         "declared_at, declared_ord) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
"""An entry answering an unanswered call, with the declaration it answers (a
:class:`Saver` that :attr:`~Saver.defers`)."""
# The placeholder's position, or NULL (refused by NOT NULL, checked before the
# conflict) when no placeholder holds the id: the upsert then overwrites it in place.
_REPLACE: Final = (
    "INSERT INTO messages (buffer_id, pos, role, result_id, healed, body) VALUES "
    "(?, (SELECT pos FROM messages WHERE buffer_id = ? AND result_id = ? AND healed = 1), "
    "'tool', ?, 0, ?) "
    "ON CONFLICT (buffer_id, result_id) WHERE result_id IS NOT NULL DO UPDATE "
    "SET body = excluded.body, healed = 0 RETURNING pos"
)
SAVE: Final = "UPDATE buffers SET count = ?, next_pos = ? WHERE id = ? RETURNING 1"
"""The buffer row's new count and next position; its one row is checked."""
_BLOCK_END: Final = (  # the last entry before the first non-result after the turn
    "SELECT pos FROM messages WHERE buffer_id = ? AND pos < coalesce("
    "(SELECT pos FROM messages WHERE buffer_id = ? AND pos > ? AND role <> 'tool' "
    "ORDER BY pos LIMIT 1), 9223372036854775807) ORDER BY pos DESC LIMIT 1"
)
_ROWS_EXPECTED: Final = (_REPLACE, SAVE)  # statements that must return exactly one row
_SAVE_PENDING: Final = "UPDATE buffers SET count = ?, next_pos = ?, pending = ? WHERE id = ?"
_PENDING_AGAIN: Final = (  # after a window cut: a call's first declaration left, if unanswered
    "SELECT c.call_id, c.turn_pos, c.ord FROM {calls} AS c WHERE c.buffer_id = ? "
    "AND c.call_id IN ({touched}) AND c.turn_pos > {cut} "
    "AND c.turn_pos = (SELECT min(turn_pos) FROM {calls} AS d "
    "WHERE d.buffer_id = c.buffer_id AND d.call_id = c.call_id AND d.turn_pos > {cut}) "
    "AND NOT EXISTS (SELECT 1 FROM messages AS m "
    "WHERE m.buffer_id = c.buffer_id AND m.result_id = c.call_id AND m.pos > {cut})"
)
_FORGET_EVICTED: Final = (  # an answer kept past the cut: its declaration went with the cut
    "UPDATE messages SET declared_at = NULL, declared_ord = NULL "
    "WHERE buffer_id = ? AND declared_at <= ?")


class Saver(Protocol):
    """Where a backend keeps a buffer's state (its count, next position, unanswered calls
    and version) and the statements that store it at the end of an append."""

    carries: bool
    """Whether the state can ride on the INSERT of the append's newest entry
    (:meth:`carried`) when the append only adds entries."""
    checked: bool
    """Whether the statements of :meth:`saved` return a row to check."""
    defers: bool
    """Whether a declaration a turn opens as unanswered waits in the state for the entry
    that answers it (``INSERT_ANSWER``), instead of a row of ``calls``
    (:mod:`.sql_declarations`)."""

    def carried(self, entry: Statement, count: int, next_pos: int, pending: PendingInRow,
                version: int | None) -> Statement:
        """The INSERT ``entry`` (of the buffer's newest entry) storing the state too."""

    def saved(self, buffer_id: int, count: int, next_pos: int, pending: PendingInRow,
              version: int | None) -> list[Statement]:
        """The statements storing the state on their own."""


class RowSaver:
    """The state kept in the buffer's row (PostgreSQL): one ``UPDATE`` of it per append
    (:data:`SAVE`, its row checked), the calls written only when the plan changed them."""

    carries = False
    checked = True
    defers = False

    def carried(self, entry: Statement, count: int, next_pos: int, pending: PendingInRow,
                version: int | None) -> Statement:
        raise NotImplementedError("the row's state is saved by its own statement")

    def saved(self, buffer_id: int, count: int, next_pos: int, pending: PendingInRow,
              version: int | None) -> list[Statement]:
        if pending.changed:
            return [(_SAVE_PENDING, (count, next_pos, pending.encode(), buffer_id))]
        return [(SAVE, (count, next_pos, buffer_id))]


IN_ROW: Final = RowSaver()
"""The default :class:`Saver`: the buffer row."""


def store_state(saver: Saver, queued: list[Statement], newest: int | None, quiet: bool,
                buffer_id: int, count: int, next_pos: int, pending: PendingInRow,
                version: int | None) -> None:
    """Queue the statements storing the buffer's state after an append: on the INSERT at
    ``queued[newest]`` (the newest entry's) when the saver carries it and the append was
    ``quiet`` (it only added entries: nothing healed, replaced or evicted), else
    :meth:`Saver.saved`'s, last."""
    if quiet and newest is not None and saver.carries:
        queued[newest] = saver.carried(queued[newest], count, next_pos, pending, version)
    else:
        queued += saver.saved(buffer_id, count, next_pos, pending, version)


Then = Callable[[int, int], Sequence[Statement]]
"""The statements that end the transaction with the append, given ``(count, appended)``."""
Applied = tuple[int, int, list[Rows]]
"""What :func:`apply_plan` did: ``(count, appended)``, and the rows of the ``then`` statements."""


class PendingInRow:
    """The unanswered calls kept in the buffer's state instead of a ``pending`` table: one
    JSON object ``{call id: [turn position, order]}`` (in the buffer's row on PostgreSQL,
    on its newest entry on SQLite, :mod:`.sqlite_head`).

    The state is written by every append anyway, so the calls an append opens or
    answers cost no statement and no page of their own. :func:`apply_plan` changes
    :attr:`calls` as it queues the plan; its :class:`Saver` stores them.
    """

    __slots__ = ("_text", "calls", "changed")

    def __init__(self, calls: dict[str, tuple[int, int]], text: str | None = None) -> None:
        self.calls = calls
        self.changed = False
        self._text = text  # the stored text, while unchanged

    @classmethod
    def decode(cls, text: str) -> PendingInRow:
        """The calls of a stored text (``buffers.pending``, SQLite's ``head_unanswered``)."""
        return cls({call: (int(turn), int(order))
                    for call, (turn, order) in json.loads(text).items()}, text)

    @classmethod
    def of(cls, calls: Iterable[PendingCall]) -> PendingInRow:
        """The calls of a view (stored ones: each turn is a position)."""
        held: dict[str, tuple[int, int]] = {}
        for call in calls:
            assert not isinstance(call.turn, NewTurn)
            held[call.call_id] = (call.turn, call.order)
        return cls(held, None if held else "{}")  # most appends leave no call unanswered

    def encode(self) -> str:
        if self._text is None or self.changed:
            self._text = encode(self.calls)  # a pair is encoded as a JSON array
        return self._text

    def as_calls(self) -> list[PendingCall]:
        """The calls as the planner's view holds them."""
        return [PendingCall(call, turn, order) for call, (turn, order) in self.calls.items()]

    def answer(self, call: str) -> tuple[int, int] | None:
        """Close ``call``; returns its declaration ``(turn, order)``, if it was open."""
        declared = self.calls.pop(call, None)
        if declared is not None:
            self.changed = True
        return declared

    def open(self, call: str, turn: int, order: int) -> None:
        self.calls[call] = (turn, order)
        self.changed = True


def apply_plan(buffer_id: int, count: int, next_pos: int, plan: AppendPlan,
               max_messages: int | None, then: Then, pending: PendingInRow,
               saver: Saver = IN_ROW,
               added: list[tuple[int, str]] | None = None,
               version: int | None = None) -> Program[Applied]:
    """Execute ``plan``, the window and ``then``'s statements; returns ``(count, appended,
    rows of then's statements)``.

    Ends the program: its last step is a final :class:`Batch`. ``saver`` stores the
    buffer's state (:class:`Saver`: the row, checked, by default); ``pending``: the
    unanswered calls the plan was made with, as the state keeps them
    (:class:`PendingInRow`). ``added`` receives ``(position, JSON text)`` of each entry
    an :class:`~flowmem.plan.AddEntry` inserts, in order. ``version``: the state's new
    version (SQLite's; with an unchecked saver only).
    """
    queued: list[Statement] = []
    positions: dict[int, int] = {}
    appended = 0
    check = saver.checked  # whether the last batch has rows to check
    newest: int | None = None  # where in queued the newest entry's INSERT is
    defers = saver.defers
    for op in plan.ops:
        if isinstance(op, AddEntry):
            positions[op.ordinal] = next_pos
            body = encode(op.message)
            newest = len(queued)
            queued += add_statements(buffer_id, next_pos, op, body, pending, defers)
            if added is not None:
                added.append((next_pos, body))
            next_pos, count, appended = next_pos + SLOT, count + 1, appended + 1
        elif isinstance(op, ReplacePlaceholder):
            check = True
            queued.append((_REPLACE, (buffer_id, buffer_id, op.call_id, op.call_id,
                                      encode(op.message))))
        elif isinstance(op, HealTurn):
            yield from _send(queued)
            turn = positions[op.turn.ordinal] if isinstance(op.turn, NewTurn) else op.turn
            queued = yield from _heal(buffer_id, turn, op.call_ids, pending, defers)
            count += len(op.call_ids)
    quiet = not (plan.healed or plan.replaced)
    if max_messages is not None and count > max_messages:
        removed, queued = yield from evict(buffer_id, count - max_messages, queued, pending,
                                           defers)
        count -= removed
        quiet = False
    store_state(saver, queued, newest, quiet, buffer_id, count, next_pos, pending, version)
    closing = then(count, appended)
    queued += closing
    answers = yield from _send(queued, final=True, check=check)
    return count, appended, answers[len(answers) - len(closing):]


def _send(statements: list[Statement], *, final: bool = False,
          check: bool = True) -> Program[list[Rows]]:
    """Run ``statements`` as one batch and check the rows the plan expects (``check``:
    whether any statement of the batch returns rows to check)."""
    if not statements:
        return []
    answers: list[Rows] = yield Batch(tuple(statements), final)
    if not check:
        return answers
    for (sql, _), rows in zip(statements, answers, strict=True):
        if sql in _ROWS_EXPECTED and len(rows) != 1:
            raise StoreError("the stored conversation does not match the view its append "
                             "was planned on (a broken invariant); nothing was stored")
    return answers


def add_statements(buffer_id: int, pos: int, op: AddEntry, body: str,
                   pending: PendingInRow, defers: bool = False) -> list[Statement]:
    """The statements inserting ``op``'s entry (JSON ``body``) at ``pos`` and indexing it;
    the calls it answers and opens change in ``pending`` (kept in the row). ``defers``:
    :attr:`Saver.defers` (:mod:`.sql_declarations`)."""
    if op.answers is None:
        statements: list[Statement] = [(INSERT_ENTRY, (buffer_id, pos, op.message["role"],
                                                         None, 0, body))]
    else:
        statements = [_answering((buffer_id, pos, "tool", op.answers, int(op.healed), body),
                                 pending, defers)]
    if op.declares:
        kept = kept_declarations(op) if defers else tuple(enumerate(op.declares))
        if kept:
            statements.append(insert_calls(buffer_id, pos, kept))
    for call, order in op.opens:
        pending.open(call, pos, order)
    return statements


def _heal(buffer_id: int, turn: int, call_ids: Sequence[str], pending: PendingInRow,
          defers: bool) -> Program[list[Statement]]:
    """The statements of the placeholders after ``turn``'s block of results (MEM-3)."""
    end = yield (_BLOCK_END, (buffer_id, buffer_id, turn))
    base = int(end[0][0])
    statements: list[Statement] = []
    for offset, call in enumerate(call_ids, start=1):
        statements.append(_answering((buffer_id, base + offset, "tool", call, 1,
                                      encode(healed_placeholder(call))), pending, defers))
    return statements


def _answering(entry: tuple[int, int, str, str, int, str], pending: PendingInRow,
               defers: bool) -> Statement:
    """The INSERT of ``entry``, a result or a placeholder, which closes its call in
    ``pending``: carrying the call's declaration when the saver ``defers``."""
    declared = pending.answer(entry[3])
    if defers and declared is not None:
        return INSERT_ANSWER, (*entry, *declared)
    return INSERT_ENTRY, entry


def evict(buffer_id: int, excess: int, before: list[Statement], pending: PendingInRow,
          defers: bool = False) -> Program[tuple[int, list[Statement]]]:
    """The window, exactly as :mod:`flowmem.buffer` defines it: sends ``before``, then
    reads what the ``excess`` oldest entries take with them (one batch); returns how
    many rows go and the statements that remove them (for the last batch). The calls
    pending again (their declaration in the cut, or their result, left; a later
    declaration stays, unanswered) are read in the same batch and set in ``pending``.

    ``defers`` (:attr:`Saver.defers`): the declarations are read from the
    ``declarations`` view, the unanswered ones written to ``calls`` first (the window
    reads every declaration by turn), and an answer kept past the cut no longer
    carries its evicted declaration (its id stays declared by a later turn's row)."""
    calls = "declarations" if defers else "calls"
    if defers and pending.calls:
        before = [*before, declarations_of(buffer_id, pending.calls.items())]
    cut = "(SELECT pos FROM messages WHERE buffer_id = ? ORDER BY pos LIMIT 1 OFFSET ?)"
    at = (buffer_id, excess - 1)
    evicted = f"(SELECT call_id FROM {calls} WHERE buffer_id = ? AND turn_pos <= {cut})"
    touched_ids = (f"SELECT call_id FROM {calls} WHERE buffer_id = ? AND turn_pos <= {cut} "
                   f"UNION SELECT result_id FROM messages WHERE buffer_id = ? AND pos <= {cut} "
                   "AND result_id IS NOT NULL")
    answers = yield from _send([
        *before,
        (cut[1:-1], at),
        (f"SELECT result_id FROM messages WHERE buffer_id = ? AND pos <= {cut} "
         "AND result_id IS NOT NULL", (buffer_id, *at)),
        (f"SELECT call_id FROM {calls} WHERE buffer_id = ? AND turn_pos <= {cut}",
         (buffer_id, *at)),
        (f"SELECT DISTINCT call_id FROM {calls} WHERE buffer_id = ? AND turn_pos > {cut} "
         f"AND call_id IN {evicted}", (buffer_id, *at, buffer_id, *at)),
        (f"SELECT result_id FROM messages WHERE buffer_id = ? AND pos > {cut} "
         f"AND result_id IN {evicted}", (buffer_id, *at, buffer_id, *at)),
        (_PENDING_AGAIN.format(touched=touched_ids, cut=cut, calls=calls),
         (buffer_id, buffer_id, *at, buffer_id, *at, *at, *at, *at)),
    ])
    cutoff_rows, affected_rows, declared_rows, kept_rows, results_rows, again = answers[-6:]
    cutoff = int(cutoff_rows[0][0])
    declared = {row[0] for row in declared_rows}
    orphans = sorted(declared - {row[0] for row in kept_rows})  # no declaration is left
    for call in {row[0] for row in affected_rows} | declared:
        pending.answer(call)
    for call, turn, order in again:
        pending.open(call, int(turn), int(order))
    statements: list[Statement] = [
        ("DELETE FROM messages WHERE buffer_id = ? AND pos <= ?", (buffer_id, cutoff)),
        ("DELETE FROM calls WHERE buffer_id = ? AND turn_pos <= ?", (buffer_id, cutoff))]
    if defers:
        statements.append((_FORGET_EVICTED, (buffer_id, cutoff)))
    if orphans:
        statements.append((f"DELETE FROM messages WHERE buffer_id = ? AND result_id IN "
                            f"({_marks(orphans)})", (buffer_id, *orphans)))
    orphaned = sum(1 for row in results_rows if row[0] in set(orphans))
    return excess + orphaned, statements


def _marks(items: Sequence[object]) -> str:
    return ", ".join("?" for _ in items)
