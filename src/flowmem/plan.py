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

Positions: entries are ordered by an integer position. Appended entries take
multiples of :data:`SLOT`; a placeholder inserted after the entry at ``p``
takes ``p + 1``, so any store can insert without renumbering.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from ._frozen import quick_init, quick_new
from .call_ids import PerTurn, assign, per_turn_ids, per_turn_lookups
from .ids import declared_call_ids, is_healed, result_id
from .messages import Message

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
    :func:`mentioned_ids`. ``pending`` lists every unanswered call (first
    declaring turn, declaration order) and is needed only when
    :func:`needs_pending` says so.

    Two more facts serve the ``per_turn`` call-id policy only (:mod:`flowmem.call_ids`;
    a strict append never reads them), both for the caller's ids of
    :func:`per_turn_lookups`: ``newest`` maps an id to the stored id of its newest
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

_new_entry = quick_new(AddEntry)  # the planner's constructions (see quick_new)
_new_pending = quick_new(PendingCall)


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


_new_plan = quick_new(AppendPlan)


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


class _Planner:
    """Plans against the view plus what this append changed (an overlay: the view is
    never copied, so planning costs O(size of the append), not O(size of the view))."""

    __slots__ = ("adds", "declared", "dropped_results", "dropped_turns", "healed", "ops",
                 "pending", "replaced", "results", "view", "view_pending")

    def __init__(self, view: BufferView) -> None:
        self.view = view
        self.results: dict[str, bool] = {}  # ids this append answered, healed or replaced
        self.declared: set[str] = set()  # ids this append declared
        self.pending: dict[str, PendingCall] = {}  # calls this append opened, unanswered
        self.view_pending = True  # the view's pending calls not yet healed
        self.ops: list[Op] = []
        self.adds = 0
        self.dropped_results = 0
        self.dropped_turns = 0
        self.healed = 0
        self.replaced = 0

    def held(self, call: str) -> bool | None:
        """Whether ``call``'s result is a placeholder; ``None`` when it has none."""
        held = self.results.get(call)
        return self.view.results.get(call) if held is None else held

    def add(self, message: Message, answers: str | None = None, healed: bool = False,
            declares: tuple[str, ...] = (), opens: tuple[tuple[str, int], ...] = ()) -> None:
        self.ops.append(_new_entry(self.adds, message, answers, healed, declares, opens))
        self.adds += 1

    def tool(self, message: Message) -> None:
        answered = result_id(message)
        if answered is None:
            self.add(message)
            return
        held = self.results.get(answered)  # self.held, inlined: this runs per result
        if held is None:
            held = self.view.results.get(answered)
        incoming_healed = is_healed(message)
        if held is None:
            self.results[answered] = incoming_healed
            self.pending.pop(answered, None)  # the view's pending is filtered at heal
            self.add(message, answered, incoming_healed)
        elif held and not incoming_healed:
            self.results[answered] = False
            self.ops.append(ReplacePlaceholder(answered, message))
            self.replaced += 1
        else:
            self.dropped_results += 1  # a duplicate (MEM-1, MEM-10): dropped

    def assistant(self, message: Message) -> None:
        ids = declared_call_ids(message)
        if not ids:
            self.add(message)  # MEM-2: a turn declaring no (usable) ids is never dropped
            return
        declared, known = self.declared, self.view.declared
        for i in ids:
            if i not in declared and i not in known:
                break
        else:
            self.dropped_turns += 1  # MEM-2: every id already declared
            return
        turn = NewTurn(self.adds)
        opens: list[tuple[str, int]] = []
        for order, call in enumerate(ids):
            # an id declared before is already pending at its first turn, or answered
            if call not in declared and call not in known and self.held(call) is None:
                self.pending[call] = _new_pending(call, turn, order)
                opens.append((call, order))
            declared.add(call)
        self.add(message, None, False, tuple(ids), tuple(opens))

    def unanswered(self) -> list[PendingCall]:
        """Every unanswered call: the view's (less those answered since), then this append's."""
        calls: list[PendingCall] = []
        if self.view_pending:
            answered = self.results
            calls = [p for p in self.view.pending if p.call_id not in answered]
            self.view_pending = False
        calls.extend(self.pending.values())
        self.pending.clear()
        return calls

    def heal(self) -> None:
        if not self.pending and not (self.view_pending and self.view.pending):
            return  # nothing unanswered (an iterable that is not a sized one is read below)
        unanswered = self.unanswered()
        if not unanswered:
            return
        groups: dict[TurnRef, list[PendingCall]] = {}
        for call in unanswered:
            groups.setdefault(call.turn, []).append(call)
        for turn in sorted(groups, key=_turn_order):
            calls = sorted(groups[turn], key=lambda c: c.order)
            self.ops.append(HealTurn(turn, tuple(c.call_id for c in calls)))
            self.healed += len(calls)
            for call in calls:
                self.results[call.call_id] = True


def _turn_order(turn: TurnRef) -> tuple[int, int]:
    return (1, turn.ordinal) if isinstance(turn, NewTurn) else (0, turn)


def _plan_one(view: BufferView, message: Message) -> AppendPlan | None:
    """The plan of a one-message append when it needs no planner state, else ``None``.

    The common appends, decided here by the same rules as :class:`_Planner`
    (a planner that has seen nothing yet reads only the view): a ``system``
    message, a ``user`` message with nothing unanswered (MEM-3 heals
    nothing), an assistant turn (MEM-2) and a tool result whose id has no
    result yet (MEM-1). Anything else — a heal, a duplicate, a placeholder
    replacement (MEM-10) — goes through the planner.
    """
    role = message["role"]
    if role == "tool":
        answered = result_id(message)
        if answered is None:
            return _new_plan((_new_entry(0, message),), 1)
        if view.results.get(answered) is not None:
            return None  # a duplicate or a replacement (MEM-1, MEM-10)
        return _new_plan((_new_entry(0, message, answered, is_healed(message)),), 1)
    if role == "assistant":
        ids = declared_call_ids(message)
        if not ids:
            return _new_plan((_new_entry(0, message),), 1)  # MEM-2: never dropped
        known, results = view.declared, view.results
        opens: list[tuple[str, int]] = []
        new = False
        for order, call in enumerate(ids):  # the ids are distinct (declared_call_ids)
            if call not in known:
                new = True
                if results.get(call) is None:
                    opens.append((call, order))
        if not new:
            return _new_plan((), 0, 0, 1)  # MEM-2: every id already declared
        return _new_plan((_new_entry(0, message, None, False, tuple(ids), tuple(opens)),), 1)
    if role == "user" and view.pending:
        return None  # MEM-3: the planner heals (an unsized iterable is read there too)
    return _new_plan((_new_entry(0, message),), 1)


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
        plan = _plan_one(view, incoming[0])
        if plan is not None:
            return plan
    return _plan(view, incoming)


def _plan(view: BufferView, incoming: Sequence[Message]) -> AppendPlan:
    """:func:`plan_append` by the planner, whatever the append."""
    planner = _Planner(view)
    for message in incoming:
        role = message["role"]
        if role == "tool":
            planner.tool(message)
        elif role == "assistant":
            planner.assistant(message)
        else:
            if role == "user":
                planner.heal()  # MEM-3: only a user message heals
            planner.add(message)
    return _new_plan(tuple(planner.ops), planner.adds, planner.dropped_results,
                     planner.dropped_turns, planner.healed, planner.replaced)
