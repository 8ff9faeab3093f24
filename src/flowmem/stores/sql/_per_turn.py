"""What a ``per_turn`` append reads beside its view (:mod:`flowmem.call_ids`), in SQL.

The ``per_turn`` call-id policy reads two facts no id of the batch names
(:class:`~flowmem.plan.BufferView`'s ``newest`` and ``firsts``): the SELECTs here
go with the view's own (same columns, ``UNION ALL``), and :func:`per_turn_facts`
reads their rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from ...call_ids import PerTurn, caller_id, per_turn_lookups
from ...ids import declared_call_ids
from ...messages import Message
from ...plan import BufferView
from .._codec import decode
from ._program import Rows

__all__ = ["FIRST", "NEWEST", "Facts", "per_turn_facts", "per_turn_parts", "with_facts"]


NEWEST: Final = 5
"""The kind of a :func:`per_turn_parts` row naming an id's newest answered declaration."""
FIRST: Final = 6
"""The kind of a :func:`per_turn_parts` row holding an id's first declaring turn."""


def per_turn_parts(buffer: str, buffer_params: Sequence[Any], incoming: Sequence[Message],
                   *, results: str = "messages", defers: bool = False,
                   open_turns: Mapping[str, int] | None = None,
                   ) -> tuple[list[str], list[Any]]:
    """The SELECTs (joined by ``UNION ALL`` with :func:`view_parts`', same columns) of the
    facts the ``per_turn`` call-id policy reads (:class:`~flowmem.plan.BufferView`'s
    ``newest`` and ``firsts``; none for another batch): for each id a result answers,
    its own result and the newest of its aliases' (one range of the results key: an
    alias is the id, U+001F and 12 hex digits), with their positions; for each id a
    turn declares, the turn declaring it first (the declarations key, and on a store
    that ``defers`` declarations, the answer carrying one). Indexed look-ups only;
    ``results``: as :func:`view_parts`'; ``open_turns``: where a store that ``defers``
    keeps the declarations still unanswered (id: turn position), which no key holds."""
    if type(incoming) is not PerTurn:
        return [], []
    answered, declared = per_turn_lookups(incoming)
    parts: list[str] = []
    params: list[Any] = []
    for call in sorted(answered):
        parts += [f"SELECT {NEWEST}, result_id, healed, pos FROM {results} "
                  f"WHERE buffer_id = {buffer} AND result_id = ?",
                  f"SELECT * FROM (SELECT {NEWEST}, result_id, healed, pos FROM {results} "
                  f"WHERE buffer_id = {buffer} AND result_id >= ? AND result_id < ? "
                  f"ORDER BY pos DESC LIMIT 1) AS n{len(parts)}"]
        params += [*buffer_params, call, *buffer_params, call + "\x1f", call + "\x20"]
    for call in sorted(declared):
        turns = f"SELECT turn_pos FROM calls WHERE buffer_id = {buffer} AND call_id = ?"
        turn_params = [*buffer_params, call]
        if defers:
            turns += (f" UNION ALL SELECT declared_at FROM {results} "
                      f"WHERE buffer_id = {buffer} AND result_id = ? AND declared_at IS NOT NULL")
            turn_params += [*buffer_params, call]
            if open_turns is not None and call in open_turns:
                turns += " UNION ALL SELECT ?"
                turn_params.append(open_turns[call])
        parts.append(f"SELECT * FROM (SELECT {FIRST}, body, 0, pos FROM messages "
                     f"WHERE buffer_id = {buffer} AND pos IN ({turns}) "
                     f"ORDER BY pos LIMIT 1) AS f{len(parts)}")
        params += [*buffer_params, *turn_params]
    return parts, params


def per_turn_facts(rows: Rows, incoming: Sequence[Message],
                   ) -> tuple[dict[str, str], dict[str, Message], dict[str, bool]]:
    """What the rows of :func:`per_turn_parts` say: ``newest`` and ``firsts`` (by the
    caller's id) and the results of the newest declarations (id: whether a placeholder).
    A row does not say which id it was read for: each id asked for gets the earliest
    turn read that declares it under itself (its own row's, as no turn declaring it
    comes earlier; a later turn may declare it again with other arguments)."""
    newest: dict[str, str] = {}
    firsts: dict[str, Message] = {}
    results: dict[str, bool] = {}
    asked = per_turn_lookups(incoming)[1] if type(incoming) is PerTurn else set()
    at: dict[str, int] = {}
    first_at: dict[str, int] = {}
    for kind, text, healed, pos in rows:
        if kind == NEWEST:
            caller = caller_id(text)
            results[text] = bool(healed)
            if caller not in at or at[caller] < int(pos):
                newest[caller], at[caller] = text, int(pos)
        elif kind == FIRST:
            turn = decode(text)
            for call in declared_call_ids(turn):
                if call in asked and (call not in first_at or int(pos) < first_at[call]):
                    firsts[call], first_at[call] = turn, int(pos)
    return newest, firsts, results


Facts = tuple[dict[str, str], dict[str, Message], dict[str, bool]]
"""What :func:`per_turn_facts` reads: ``newest``, ``firsts`` and the newest's results."""


def with_facts(view: BufferView, facts: Facts, *, merge: bool = True) -> BufferView:
    """``view`` with the ``per_turn`` facts of :func:`per_turn_facts` (``view`` itself when
    there are none); ``merge``: whether the newest declarations' results join the view's
    (a store whose view knows them already passes ``False``: no copy)."""
    newest, firsts, results = facts
    if not newest and not firsts:
        return view
    if merge and results:
        merged = {**view.results, **results}
        return BufferView(merged, view.declared, view.pending, newest, firsts)
    return BufferView(view.results, view.declared, view.pending, newest, firsts)
