"""Where a declaration is stored (MEM-2): the ``calls`` key, or the answer that closes it.

With a :class:`~flowmem.stores.sql._apply.Saver` that ``defers`` (SQLite, schema 8),
a call that a turn opens as unanswered is not written to ``calls``: the unanswered
calls in the conversation's state hold it, and the entry that answers it (a result,
or a placeholder, MEM-3) carries it in its ``declared_at``/``declared_ord`` columns.
So a declaring turn writes one row, not a random leaf of the calls' key per id, and
the declaration rides on the row of the MEM-1 results key that its answer writes
anyway. Only a declaration that opens nothing (the id was declared or answered
before) goes to ``calls`` (:func:`kept_declarations`).

A conversation's declarations are then ``calls``, the answers' columns (SQLite's
``declarations`` view, which the window reads by turn) and the unanswered calls
(:func:`with_pending`). PostgreSQL writes every declaration to ``calls``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache

from ...plan import AddEntry
from ._program import Statement

__all__ = ["declarations_of", "insert_calls", "kept_declarations", "with_pending"]


def kept_declarations(op: AddEntry) -> tuple[tuple[int, str], ...]:
    """The ``(order, id)`` of the declarations of ``op`` that a deferring saver writes to
    ``calls``: those it does not open as unanswered (MEM-2)."""
    if len(op.opens) == len(op.declares):
        return ()  # the common turn: every id it declares is new
    opened = {call for call, _ in op.opens}
    return tuple((order, call) for order, call in enumerate(op.declares) if call not in opened)


def insert_calls(buffer_id: int, pos: int, calls: Sequence[tuple[int, str]]) -> Statement:
    """One multi-row insert of the declarations ``(order, id)`` of a turn at ``pos``."""
    params = [value for order, call in calls for value in (buffer_id, call, pos, order)]
    return _calls_sql(len(calls)), params


def declarations_of(buffer_id: int, calls: Iterable[tuple[str, tuple[int, int]]]) -> Statement:
    """One multi-row insert of declarations ``(id, (turn, order))`` of any turns."""
    params = [value for call, (turn, order) in calls for value in (buffer_id, call, turn, order)]
    return _calls_sql(len(params) // 4), params


@lru_cache(maxsize=64)
def _calls_sql(rows: int) -> str:
    """The text of :func:`insert_calls`' statement (the same object each time: a driver's
    statement cache finds it without hashing a new text)."""
    values = ", ".join("(?, ?, ?, ?)" for _ in range(rows))
    return (f"INSERT INTO calls (buffer_id, call_id, turn_pos, ord) VALUES {values} "
            "ON CONFLICT DO NOTHING")


def with_pending(declared: set[str], pending: Iterable[str]) -> set[str]:
    """``declared`` with the unanswered calls: every one was declared (MEM-2), and a
    deferring saver keeps their declarations only there (module notes)."""
    declared.update(pending)
    return declared
