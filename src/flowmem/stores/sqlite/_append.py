"""The short path of a hot SQLite append: the program's statements, without the program.

An append is a sans-I/O program (:mod:`flowmem.stores.sql._conversations`, :mod:`._programs`,
:mod:`flowmem.stores.sql._apply`): nested generators driven one statement at a time. SQLite has
no round trips to save, and there the generators' protocol costs about as much
Python as the rest of the append. The common append is run here by plain calls
instead: when this connection's hot copy of the buffer (:mod:`._view_cache`) is
current — after ``PRAGMA data_version`` and, when another connection committed,
the version check; a partial copy first reads the view of the ids the plan names
that it does not know, by the program's own statement — and the plan (still
:func:`flowmem.plan.plan_append`'s: no rule is decided here) only adds
entries, the window evicts nothing, there is no idempotency key, and the
tail, if asked for, is one the hot copy holds.

It runs exactly the statements the program would (same text, same parameters,
same order: built by the same functions of :mod:`flowmem.stores.sql._apply`, or, for the
common append of one entry, written out by :func:`_apply_one` to the same
bytes without the generic queue) and changes the hot copy exactly as
:meth:`SQLiteConversations.apply
<flowmem.stores.sqlite._programs.SQLiteConversations.apply>` does. Any other
append goes on as the program from the statements already run
(:meth:`~flowmem.stores.sqlite._programs.SQLiteConversations.opened`), so
nothing is run twice. ``short=False`` runs every append as the program: the
switch exists so that tests/stores/sqlite/test_sqlite_fast.py can check that both paths trace
the same statements and give the same outcomes.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Sequence

from ..._frozen import quick_new
from ...call_ids import PerTurn
from ...messages import Message
from ...plan import SLOT, AddEntry, AppendPlan, BufferView, Op, mentioned_ids, plan_append
from ...retention import Expiry
from ...scopes import StorageKey
from ...store import AppendOutcome, Idempotency, plan_stats
from .._codec import encode
from ..sql._apply import PendingInRow, add_statements, store_state
from ..sql._declarations import insert_calls, kept_declarations
from ..sql._program import Execute, Statement, drive
from ._programs import (
    DATA_VERSION,
    VERSION,
    SQLiteConversations,
    hot_tail,
    learned,
    learning,
    per_turn_statement,
    per_turn_view,
)
from ._state import ANSWER_WITH_HEAD, INSERT_WITH_HEAD, ON_NEWEST
from ._view_cache import HotBuffer, HotBuffers, adds_only

__all__ = ["executor", "run_append", "run_expiring"]


def executor(cursor: sqlite3.Cursor) -> Execute:
    """The :data:`~flowmem.stores.sql._program.Execute` of a program on ``cursor``."""
    return lambda sql, params: cursor.execute(sql, params).fetchall()


def run_expiring(sql: SQLiteConversations, cursor: sqlite3.Cursor, key: StorageKey,
                 incoming: Sequence[Message], max_messages: int | None, serialized: bool,
                 idempotency: Idempotency | None, tail: int, expiry: Expiry | None, *,
                 short: bool = True) -> AppendOutcome:
    """:func:`run_append` under a retention policy: the key's expired data dropped first
    (the hot copy with it), the conversation's expiry set after, in the same transaction."""
    if expiry is None:
        return run_append(sql, cursor, key, incoming, max_messages, serialized, idempotency,
                          tail, short=short)
    if cursor.execute(*sql.expired_check(key, expiry.now)).fetchone() is not None:
        for statement, params in sql.purge_statements(key, expiry.now):  # no round trips here
            cursor.execute(statement, params)
        sql.forget_hot(key)  # the expired buffer is gone: a new one starts
    outcome = run_append(sql, cursor, key, incoming, max_messages, serialized, idempotency,
                         tail, short=short)
    unset = "" if expiry.renew else " AND expires_at IS NULL"  # absolute: set once
    cursor.execute(f"UPDATE buffers SET expires_at = ? WHERE {sql.named}{unset}",
                   (expiry.at, *sql.named_params(key)))
    return outcome


def run_append(sql: SQLiteConversations, cursor: sqlite3.Cursor, key: StorageKey,
               incoming: Sequence[Message], max_messages: int | None, serialized: bool,
               idempotency: Idempotency | None, tail: int, *,
               short: bool = True) -> AppendOutcome:
    """One append in ``cursor``'s transaction (the arguments of
    :meth:`SQLConversations.append <flowmem.stores.sql._conversations.SQLConversations.append>`):
    the short path when it applies."""
    hot = sql.hot
    if not short or hot is None or idempotency is not None:
        return drive(sql.append(key, incoming, max_messages, serialized, idempotency, tail),
                     executor(cursor))
    names = (key.scope, key.scope_id, key.key)
    hot.version = version = cursor.execute(DATA_VERSION[0]).fetchone()[0]  # observed
    buffer = hot.get(names)
    if buffer is not None and buffer.checked != version:  # another connection committed
        buffer = sql.checked(names, buffer,
                             cursor.execute(VERSION, (buffer.buffer_id,)).fetchall())
    if buffer is not None:
        view = buffer.view()
        if type(incoming) is PerTurn:
            if buffer.known is not None:
                # the per_turn policy's assignment looks up ids no entry of the plan names
                # (an id's alias for its turn): a partial copy learns every id the batch
                # mentions first, as the program does (SQLiteConversations.opened)
                unknown = buffer.unknown(mentioned_ids(incoming))
                if unknown:
                    learned(buffer, unknown,
                            cursor.execute(*learning(buffer, unknown)).fetchall())
            statement = per_turn_statement(buffer, incoming)
            if statement is not None:  # and the facts no copy keeps (read every time)
                view = per_turn_view(buffer, incoming, cursor.execute(*statement).fetchall())
        plan = plan_append(view, incoming)
        if buffer.known is not None:
            # a partial copy learns what the plan named that it did not know; the plan
            # stands unless one of those ids turns out held
            unknown = buffer.unknown_in(plan)
            if unknown:  # the program's learn, by plain calls
                held = learned(buffer, unknown,
                               cursor.execute(*learning(buffer, unknown)).fetchall())
            else:
                held = False
            if held:
                plan = plan_append(_refreshed(view, buffer), incoming)
        if adds_only(plan, buffer.count, max_messages) and (not tail or buffer.serves(tail)):
            ops = plan.ops  # then the program would only add entries and read nothing more
            if len(ops) == 1:
                return _apply_one(hot, buffer, plan, ops[0], cursor, serialized, tail)
            return _apply(hot, buffer, plan, cursor, serialized, tail)
    opening = sql.opened(key, incoming, buffer)  # on as the program, from here
    return drive(sql.append(key, incoming, max_messages, serialized, None, tail, opening),
                 executor(cursor))


def _refreshed(view: BufferView, buffer: HotBuffer) -> BufferView:
    """The hot copy's view after it learned more, with ``view``'s per_turn facts."""
    fresh = buffer.view()
    if fresh is view or (not view.newest and not view.firsts):
        return fresh
    return BufferView(fresh.results, fresh.declared, fresh.pending, view.newest, view.firsts)


def _apply_one(hot: HotBuffers, buffer: HotBuffer, plan: AppendPlan, op: Op,
               cursor: sqlite3.Cursor, serialized: bool, tail: int) -> AppendOutcome:
    """:func:`_apply` of a plan of ONE entry, the common append, by plain statements: the
    statements :func:`~flowmem.stores.sql._apply.add_statements` and
    :meth:`HeadSaver.carried <flowmem.stores.sqlite._state.HeadSaver.carried>` make, in
    their order (tests/stores/sqlite/test_sqlite_fast.py compares the traces of the two paths)."""
    assert type(op) is AddEntry  # adds_only: nothing healed or replaced
    buffer_id, pos, pending = buffer.buffer_id, buffer.next_pos, buffer.pending
    answers, opens = op.answers, op.opens
    version = random.getrandbits(62)  # drawn where the program draws it
    body = encode(op.message)
    answered = pending.get(answers) if answers is not None else None
    if opens or answered is not None:  # the calls change
        left = len(pending) - (answered is not None)  # (a comprehension is a call: skipped)
        calls = {c: (p.turn, p.order) for c, p in pending.items() if c != answers} if left else {}
        for call, order in opens:
            calls[call] = (pos, order)
        text = encode(calls) if calls else "{}"
    else:
        text = encode({c: (p.turn, p.order) for c, p in pending.items()}) if pending else "{}"
    count = buffer.count + 1
    role, healed = (op.message["role"], 0) if answers is None else ("tool", int(op.healed))
    if answered is None:  # no result, an orphan, or an id answered before: nothing to carry
        cursor.execute(INSERT_WITH_HEAD, (buffer_id, pos, role, answers, healed, body,
                                          count, pos + SLOT, text, version))
    else:  # the declaration it answers rides on it (sql_declarations)
        cursor.execute(ANSWER_WITH_HEAD, (buffer_id, pos, role, answers, healed, body,
                                          answered.turn, answered.order, count, pos + SLOT,
                                          text, version))
    if len(opens) != len(op.declares):  # a declaration that opens nothing (sql_declarations)
        cursor.execute(*insert_calls(buffer_id, pos, kept_declarations(op)))
    buffer.added(op, body, version, hot.version)
    page = hot_tail(buffer, tail, count) if tail else None
    return _outcome(count, plan.appended, serialized, plan_stats(plan), False, page)


def _apply(hot: HotBuffers, buffer: HotBuffer, plan: AppendPlan, cursor: sqlite3.Cursor,
           serialized: bool, tail: int) -> AppendOutcome:
    """:func:`~flowmem.stores.sql._apply.apply_plan` of an add-only plan on a hot copy,
    then the copy's update (as :meth:`SQLiteConversations.apply` does)."""
    buffer_id, pos, count = buffer.buffer_id, buffer.next_pos, buffer.count
    pending = PendingInRow.of(buffer.pending.values())
    version = random.getrandbits(62)  # drawn where the program draws it
    queued: list[Statement] = []
    added: list[tuple[int, str]] = []
    newest: int | None = None
    for op in plan.ops:
        assert isinstance(op, AddEntry)  # adds_only: nothing healed or replaced
        body = encode(op.message)
        newest = len(queued)
        queued += add_statements(buffer_id, pos, op, body, pending, ON_NEWEST.defers)
        added.append((pos, body))
        pos += SLOT
    count += plan.appended
    store_state(ON_NEWEST, queued, newest, True, buffer_id, count, pos, pending, version)
    execute = cursor.execute  # no rows to read: each statement runs whole in execute
    for sql, params in queued:
        execute(sql, params)
    buffer.apply(plan, count, added)
    buffer.version, buffer.checked = version, hot.version
    page = hot_tail(buffer, tail, count) if tail else None
    return AppendOutcome(count, plan.appended, serialized, plan_stats(plan), tail=page)


_outcome = quick_new(AppendOutcome)
