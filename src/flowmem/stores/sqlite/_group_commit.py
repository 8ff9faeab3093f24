"""Group commit for SQLite: several appends in ONE ``BEGIN IMMEDIATE`` transaction.

The asyncio SQLite store (:mod:`flowmem.stores.sqlite._aio`) hands the
appends queued on its connection thread to :meth:`SQLiteStore.append_group
<flowmem.stores.sqlite.SQLiteStore.append_group>`, which runs them here:

- MEM-12: the locks of every key of the group are held across the whole
  transaction, taken in sorted stripe order (so two groups never wait on
  each other in a cycle), each stripe once even when several appends share
  it. Each append's bounded wait is its own ``lock_timeout``; an append
  whose lock was not had is reported unserialized, exactly as alone.
- Each append runs its ordinary SQL program (:mod:`flowmem.stores.sql._conversations`: the
  plan, the idempotency claim and record) inside its own ``SAVEPOINT``: an
  append refused by a rule (:class:`~flowmem.errors.KeyConflict`,
  :class:`~flowmem.errors.IdempotencyConflict`) is rolled back to its
  savepoint and fails alone; its neighbours commit.
- One ``COMMIT`` (one fsync at ``synchronous=full``) for the group; nothing
  is reported before it. When the database itself fails inside the group (an
  ``sqlite3`` error), the transaction is rolled back whole and every append
  of the group runs again on its own, so each one gets its own answer.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from ...messages import Message
from ...scopes import StorageKey
from ...store import AppendOutcome, Idempotency
from .._holds import Holds
from .._locks import KeyLocks, stripe_of
from ._append import run_append
from ._programs import SQLiteConversations

__all__ = ["AppendRequest", "GroupAborted", "each_alone", "group_locks", "run_group", "run_unheld"]

_SAVEPOINT = "flowmem_append"
Answers = list[AppendOutcome | Exception]


@dataclass(frozen=True, slots=True)
class AppendRequest:
    """One append of a group: the arguments of :meth:`Store.append <flowmem.store.Store.append>`."""

    key: StorageKey
    incoming: Sequence[Message]
    max_messages: int | None
    lock_timeout: float
    idempotency: Idempotency | None = None
    tail: int = 0


class GroupAborted(Exception):
    """The database failed inside a group: it was rolled back; run each append alone."""


@contextmanager
def group_locks(locks: KeyLocks, requests: Sequence[AppendRequest]) -> Iterator[list[bool]]:
    """Hold the MEM-12 locks of every request; yields, per request, whether its lock was had."""
    start = time.monotonic()
    stripes = [stripe_of(r.key) for r in requests]
    deadline: dict[int, float] = {}
    for stripe, request in zip(stripes, requests, strict=True):
        deadline[stripe] = min(deadline.get(stripe, math.inf), start + request.lock_timeout)
    had: dict[int, bool] = {}
    with ExitStack() as stack:
        for stripe in sorted(deadline):  # one global order: no two groups wait in a cycle
            wait = max(0.0, deadline[stripe] - time.monotonic())
            had[stripe] = stack.enter_context(locks.hold_stripe(stripe, wait))
            if had[stripe] and locks.holds is not None:
                locks.holds.withdraw(stripe)  # a holder killed while holding left it published
        yield [had[stripe] for stripe in stripes]


def each_alone(append: Callable[..., AppendOutcome],
               requests: Sequence[AppendRequest]) -> Answers:
    """Every request as its own append (after a group was rolled back); one answer each."""
    answers: Answers = []
    for r in requests:
        try:
            answers.append(append(r.key, r.incoming, max_messages=r.max_messages,
                                  lock_timeout=r.lock_timeout, idempotency=r.idempotency,
                                  tail=r.tail))
        except Exception as exc:
            answers.append(exc)
    return answers


def run_group(within: Callable[[Callable[[sqlite3.Cursor], Answers]], Answers],
              sql: SQLiteConversations,
              requests: Sequence[AppendRequest], serialized: Sequence[bool],
              short: bool = True) -> Answers:
    """Run ``requests`` in one transaction, each in its own savepoint; one answer each.

    ``within`` runs a body in one transaction (``SQLiteStore._within``); ``short``: an
    append may take the short path (:mod:`._append`). Raises :class:`GroupAborted`
    (after the rollback) when the database fails.
    """

    def body(cursor: sqlite3.Cursor) -> Answers:
        answers: Answers = []
        for request, held in zip(requests, serialized, strict=True):
            cursor.execute(f"SAVEPOINT {_SAVEPOINT}")
            try:
                answers.append(run_append(sql, cursor, request.key, request.incoming,
                                          request.max_messages, held, request.idempotency,
                                          request.tail, short=short))
            except sqlite3.Error as exc:
                raise GroupAborted(str(exc)) from exc
            except Exception as refused:  # a rule refused this append alone
                sql.forget_hot()  # whatever it taught the hot copy is rolled back
                cursor.execute(f"ROLLBACK TO {_SAVEPOINT}")
                answers.append(refused)
            cursor.execute(f"RELEASE {_SAVEPOINT}")
        return answers

    return within(body)


class _Held(Exception):
    """A hold of a request's key is published (:mod:`flowmem.stores._holds`): the group
    takes the locks."""


def run_unheld(within: Callable[[Callable[[sqlite3.Cursor], Answers]], Answers], holds: Holds,
               sql: SQLiteConversations, requests: Sequence[AppendRequest],
               short: bool = True) -> Answers | None:
    """:func:`run_group` without the key locks when no request's key is held — read inside
    the group's transaction, whose write lock keeps any hold from being published until
    it commits (:mod:`flowmem.stores._holds`); ``None``, with nothing written, when one is."""
    stripes = [stripe_of(r.key) for r in requests]

    def unheld(body: Callable[[sqlite3.Cursor], Answers]) -> Answers:
        def checked(cursor: sqlite3.Cursor) -> Answers:
            if any(holds.held(stripe) for stripe in stripes):
                raise _Held
            return body(cursor)
        return within(checked)

    try:
        return run_group(unheld, sql, requests, [True] * len(requests), short)
    except _Held:
        return None
