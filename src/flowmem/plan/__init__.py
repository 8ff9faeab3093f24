"""The append planner: the ONE place the buffer rules are decided.

An append is planned against a :class:`BufferView` — what the buffer already
holds for the ids the incoming messages mention, and its unanswered calls —
and the plan is a short list of operations that every store applies with its
own indexed statements. No store decides a rule; each only executes a plan.
This is what keeps the in-memory buffer, SQLite, PostgreSQL and Redis in
agreement, and keeps the cost of an append independent of the length of the
conversation (the view is a handful of indexed look-ups).

Rules decided here:

- MEM-1: a tool result whose id already has a result is dropped.
- MEM-2: an assistant turn is dropped only when EVERY id it declares is
  already declared; a turn declaring no (usable) ids is never dropped.
- MEM-3: before a ``user`` message, each unanswered call gets a healed
  placeholder right after its declaring turn's block, in declaration order.
- MEM-10: a real result for an id held by a placeholder replaces it in
  place; an incoming message itself marked healed never replaces anything.
- MEM-11: every id is read through :mod:`flowmem.ids`.
- MEM-14: ``appended`` counts the incoming messages that became entries.

Under the ``per_turn`` call-id policy (:mod:`flowmem.call_ids`) the same rules act
on the stored ids that policy gives a batch's ids, before planning.

"In the buffer" always includes what this same append added earlier.

The view and the plan's operations are defined in ``_types``, the planner in
``_planner``; every name is imported from here.

Positions: entries are ordered by an integer position. Appended entries take
multiples of :data:`SLOT`; a placeholder inserted after the entry at ``p``
takes ``p + 1``, so any store can insert without renumbering.
"""

from __future__ import annotations

from collections.abc import Container, Sequence

from ..call_ids import PerTurn, assign, per_turn_ids, per_turn_lookups
from ..messages import Message
from ._planner import plan_any, plan_one
from ._types import (
    SLOT,
    AddEntry,
    AppendPlan,
    BufferView,
    HealTurn,
    NewTurn,
    Op,
    PendingCall,
    ReplacePlaceholder,
    TurnRef,
)

__all__ = [
    "SLOT",
    "AddEntry",
    "AppendPlan",
    "BufferView",
    "HealTurn",
    "NewTurn",
    "Op",
    "PendingCall",
    "ReplacePlaceholder",
    "TurnRef",
    "mentioned_ids",
    "needs_pending",
    "per_turn_lookups",
    "plan_append",
    "stored_ids",
]


def mentioned_ids(incoming: Sequence[Message]) -> set[str]:
    """The ids a store must look up for :attr:`BufferView.results`/``declared``."""
    if type(incoming) is PerTurn:
        return per_turn_ids(incoming)
    answered, declared = per_turn_lookups(incoming)  # the ids results answer, turns declare
    return answered | declared


def needs_pending(incoming: Sequence[Message]) -> bool:
    """Whether the append heals, so the store must list the unanswered calls (always
    under the ``per_turn`` policy: its results pair with them, :mod:`flowmem.call_ids`)."""
    if type(incoming) is PerTurn:
        return True
    for message in incoming:  # noqa: SIM110 - a loop, not any(generator): every append
        if message["role"] == "user":
            return True
    return False


class _Declared:
    """A view's declared ids with its unanswered calls' (declared by definition: a view
    need only cover the ids an append mentions, and the per-turn policy may route a
    result or a turn to an unanswered call's stored id it does not mention)."""

    __slots__ = ("known", "open")

    def __init__(self, known: Container[str], open_: set[str]) -> None:
        self.known, self.open = known, open_

    def __contains__(self, call: object) -> bool:
        return call in self.open or call in self.known


def stored_ids(view: BufferView, incoming: Sequence[Message]) -> tuple[BufferView, list[Message]]:
    """The ``per_turn`` call-id policy's first step (:mod:`flowmem.call_ids`): ``incoming``
    with the stored id of each id, and the view to plan them on (its unanswered calls
    counted as declared). :func:`plan_append` takes it for a
    :class:`~flowmem.call_ids.PerTurn` batch; a caller that must map the plan's
    messages back to its own plans ``stored_ids``' messages itself."""
    pending = list(view.pending)
    open_view = BufferView(view.results,
                           _Declared(view.declared, {p.call_id for p in pending}), pending,
                           view.newest, view.firsts)
    return open_view, assign(open_view, incoming)


def plan_append(view: BufferView, incoming: Sequence[Message]) -> AppendPlan:
    """Plan appending canonical ``incoming`` messages to the buffer ``view`` describes.

    A :class:`~flowmem.call_ids.PerTurn` batch is planned under the ``per_turn``
    call-id policy: its ids are first given their stored ids
    (:func:`~flowmem.call_ids.assign`), then the rules act on those.
    """
    if type(incoming) is PerTurn:
        view, incoming = stored_ids(view, incoming)
    if len(incoming) == 1:
        plan = plan_one(view, incoming[0])
        if plan is not None:
            return plan
    return plan_any(view, incoming)
