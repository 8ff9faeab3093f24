"""The plan's types: the view a store gives the planner, and the plan it applies.

A :class:`BufferView` says what the buffer holds for the ids an append
mentions; an :class:`AppendPlan` is a short tuple of operations
(:class:`AddEntry`, :class:`ReplacePlaceholder`, :class:`HealTurn`) every store
executes with its own statements. Re-exported by :mod:`flowmem.plan`.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from .._frozen import quick_init, quick_new
from ..messages import Message

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
    "new_entry",
    "new_pending",
    "new_plan",
]


SLOT: Final = 1 << 20
"""Distance between the positions of two appended entries."""


@quick_init
@dataclass(frozen=True, slots=True)
class NewTurn:
    """A turn added by this same append: the ``ordinal``-th :class:`AddEntry`."""

    ordinal: int


TurnRef = int | NewTurn
"""A declaring turn: a stored position, or a turn this append adds."""


@quick_init
@dataclass(frozen=True, slots=True)
class PendingCall:
    """A declared call with no result yet: its id, declaring turn and index in it."""

    call_id: str
    turn: TurnRef
    order: int


@quick_init
@dataclass(frozen=True, slots=True)
class BufferView:
    """What a store tells the planner about the buffer before an append.

    ``results`` maps an id to whether its result is a healed placeholder, and
    ``declared`` holds the declared ids; both need only cover
    :func:`~flowmem.plan.mentioned_ids`. ``pending`` lists every unanswered call (first
    declaring turn, declaration order) and is needed only when
    :func:`~flowmem.plan.needs_pending` says so.

    Two more facts serve the ``per_turn`` call-id policy only (:mod:`flowmem.call_ids`;
    a strict append never reads them), both for the caller's ids of
    :func:`~flowmem.plan.per_turn_lookups`: ``newest`` maps an id to the stored id of its newest
    declaration that has a result (its alias, or the id itself), with that result in
    ``results``; ``firsts`` maps an id to the turn of its first declaration (the one
    stored under the id itself), which tells a copy of it.

    The planner only reads a view, never changes it, and reads it only while
    planning: a store holding its indexes in memory may hand over live ones
    (:class:`~flowmem.ConversationBuffer` does, so its view costs nothing).
    """

    results: Mapping[str, bool] = field(default_factory=dict)
    declared: Container[str] = frozenset()
    pending: Iterable[PendingCall] = ()
    newest: Mapping[str, str] = field(default_factory=dict)
    firsts: Mapping[str, Message] = field(default_factory=dict)


@quick_init
@dataclass(frozen=True, slots=True)
class AddEntry:
    """Append ``message`` as a new entry at the end of the buffer.

    ``answers``/``healed`` index it as a result, ``declares`` lists the ids
    the turn declares (in order) and ``opens`` the ``(id, order)`` pairs that
    become unanswered calls with this turn as their declaring turn.
    """

    ordinal: int
    message: Message
    answers: str | None = None
    healed: bool = False
    declares: tuple[str, ...] = ()
    opens: tuple[tuple[str, int], ...] = ()


@quick_init
@dataclass(frozen=True, slots=True)
class ReplacePlaceholder:
    """Overwrite the healed placeholder of ``call_id`` in place (MEM-10)."""

    call_id: str
    message: Message


@quick_init
@dataclass(frozen=True, slots=True)
class HealTurn:
    """Insert placeholders for ``call_ids`` after ``turn``'s block of results (MEM-3)."""

    turn: TurnRef
    call_ids: tuple[str, ...]


Op = AddEntry | ReplacePlaceholder | HealTurn

new_entry = quick_new(AddEntry)  # the planner's constructions (see quick_new)
new_pending = quick_new(PendingCall)


@quick_init
@dataclass(frozen=True, slots=True)
class AppendPlan:
    """The operations of one append, in order, and how many entries it adds.

    ``dropped_results`` counts incoming tool results dropped as duplicates
    (MEM-1, and MEM-10's healed duplicates), ``dropped_turns`` incoming
    assistant turns dropped because every id they declare is known (MEM-2);
    ``healed`` counts the placeholders it inserts (MEM-3), ``replaced`` the
    placeholders it overwrites with a real result (MEM-10).
    """

    ops: tuple[Op, ...]
    appended: int
    dropped_results: int = 0
    dropped_turns: int = 0
    healed: int = 0
    replaced: int = 0


new_plan = quick_new(AppendPlan)
