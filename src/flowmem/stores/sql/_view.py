"""The planner's view of a conversation, read by indexed look-ups (shared SQL).

For the ids an append mentions: whether the buffer holds a result for each
(and whether it is a healed placeholder) and whether a turn declares it; the
unanswered calls come from the buffer's row. One ``UNION ALL`` statement, so a
store can send it in the batch that reads the row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...messages import Message
from ...plan import BufferView
from ._apply import PendingInRow
from ._declarations import with_pending
from ._per_turn import per_turn_facts, with_facts
from ._program import Rows

__all__ = ["view_from", "view_parts", "view_sets"]


def _marks(items: Sequence[Any]) -> str:
    return ", ".join("?" for _ in items)


def view_parts(buffer: str, buffer_params: Sequence[Any], ids: Sequence[str],
               *, results: str = "messages", answers: str = "0") -> tuple[list[str], list[Any]]:
    """The SELECTs of the planner's view (to be joined by UNION ALL) and their params: the
    results and declarations of ``ids`` (those an append mentions; the unanswered calls
    are in the buffer's row).

    ``buffer`` is the SQL naming the buffer's id (``"?"`` with ``buffer_params``
    ``(id,)``, or a subquery); each row is ``(kind, id, 0 or healed, 0 or answers)``.
    ``results``: the table the results are read from, with a dialect's index hint;
    ``answers``: the SQL telling whether a result carries its declaration (SQLite's
    :mod:`._apply`'s notes).
    """
    parts: list[str] = []
    params: list[Any] = []
    if ids:
        parts += [f"SELECT 0, result_id, healed, {answers} FROM {results} "
                  f"WHERE buffer_id = {buffer} "
                  f"AND result_id IN ({_marks(ids)})",
                  f"SELECT 1, call_id, 0, 0 FROM calls WHERE buffer_id = {buffer} "
                  f"AND call_id IN ({_marks(ids)})"]
        params += [*buffer_params, *ids, *buffer_params, *ids]
    return parts, params


def view_from(rows: Rows, pending: PendingInRow,
              incoming: Sequence[Message] = ()) -> BufferView:
    """The :class:`BufferView` of the rows of :func:`view_parts`' statement (and
    :func:`per_turn_parts`', for ``incoming``) and the buffer row's unanswered calls
    (declared too: :func:`~._declarations.with_pending`)."""
    results, declared = view_sets(rows)
    view = BufferView(results, with_pending(declared, pending.calls), pending.as_calls())
    return with_facts(view, per_turn_facts(rows, incoming))  # per_turn (._per_turn)


def view_sets(rows: Rows) -> tuple[dict[str, bool], set[str]]:
    """The results (id: whether a placeholder) and the declared ids of the rows of
    :func:`view_parts`' statement: a declaration's row, or a result carrying one
    (the rows of :func:`per_turn_parts` are read by :func:`per_turn_facts`)."""
    results: dict[str, bool] = {}
    declared: set[str] = set()
    for kind, call, first, answers in rows:
        if kind == 0:
            results[call] = bool(first)
            if answers:
                declared.add(call)
        elif kind == 1:
            declared.add(call)
    return results, declared
