"""The planner proper: the rules applied to an append's messages in order.

:func:`plan_one` decides the common one-message appends from the view alone;
:func:`plan_any` runs :class:`_Planner`, which plans against the view plus what
the append changed so far, for every append. :func:`flowmem.plan.plan_append`
picks between them; the rules are those its module lists.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..ids import declared_call_ids, is_healed, result_id
from ..messages import Message
from ._types import (
    AppendPlan,
    BufferView,
    HealTurn,
    NewTurn,
    Op,
    PendingCall,
    ReplacePlaceholder,
    TurnRef,
    new_entry,
    new_pending,
    new_plan,
)

__all__ = ["plan_any", "plan_one"]


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
        self.ops.append(new_entry(self.adds, message, answers, healed, declares, opens))
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
                self.pending[call] = new_pending(call, turn, order)
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


def plan_one(view: BufferView, message: Message) -> AppendPlan | None:
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
            return new_plan((new_entry(0, message),), 1)
        if view.results.get(answered) is not None:
            return None  # a duplicate or a replacement (MEM-1, MEM-10)
        return new_plan((new_entry(0, message, answered, is_healed(message)),), 1)
    if role == "assistant":
        ids = declared_call_ids(message)
        if not ids:
            return new_plan((new_entry(0, message),), 1)  # MEM-2: never dropped
        known, results = view.declared, view.results
        opens: list[tuple[str, int]] = []
        new = False
        for order, call in enumerate(ids):  # the ids are distinct (declared_call_ids)
            if call not in known:
                new = True
                if results.get(call) is None:
                    opens.append((call, order))
        if not new:
            return new_plan((), 0, 0, 1)  # MEM-2: every id already declared
        return new_plan((new_entry(0, message, None, False, tuple(ids), tuple(opens)),), 1)
    if role == "user" and view.pending:
        return None  # MEM-3: the planner heals (an unsized iterable is read there too)
    return new_plan((new_entry(0, message),), 1)


def plan_any(view: BufferView, incoming: Sequence[Message]) -> AppendPlan:
    """:func:`~flowmem.plan.plan_append` by the planner, whatever the append."""
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
    return new_plan(tuple(planner.ops), planner.adds, planner.dropped_results,
                     planner.dropped_turns, planner.healed, planner.replaced)
