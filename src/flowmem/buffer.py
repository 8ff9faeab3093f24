"""The conversation buffer: :func:`append` and :class:`ConversationBuffer`.

Both implement the append rules exactly as :mod:`flowmem.plan` decides them
(MEM-1, 2, 3, 10, 11, 14) plus the window: ``max_messages`` (``None`` =
unbounded) evicts the oldest entries once, at the end of an append. A tool
result never outlives the turn that declared it, so the buffer may end up
holding fewer than ``max_messages``.

Eviction, precisely (every store implements exactly this):

1. Remove the ``count - max_messages`` oldest entries.
2. An id that a removed turn declared and no remaining turn declares is
   dead: its result is removed too, wherever it stands.
3. For every id a removed entry declared or answered, the call is
   unanswered again if a remaining turn declares it and no result remains.
"""

from __future__ import annotations

import weakref
from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence
from typing import Final

from .call_ids import CallIds, PerTurn, caller_id, check_call_ids, refuse_aliases
from .entries import derive_indexes, edit_entries
from .errors import InvalidInput
from .ids import declared_call_ids, is_healed, result_id
from .messages import Message, canonical_messages, healed_placeholder, json_copy
from .plan import (
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
    plan_append,
)
from .plan._types import new_pending
from .results import AppendResult

__all__ = ["AppendResult", "ConversationBuffer", "append", "check_max_messages"]


def check_max_messages(max_messages: int | None) -> int | None:
    """Validate a window size: ``None`` (unbounded) or an int ≥ 1."""
    if max_messages is None:
        return None
    if isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 1:
        raise InvalidInput(f"max_messages must be None or an integer >= 1, got {max_messages!r}")
    return max_messages


class _Entry:
    __slots__ = ("message", "pos")

    pos: int
    message: Message


def _entry(pos: int, message: Message) -> _Entry:
    # no __init__: ``_Entry()`` then two slot stores cost half a call through ``__init__``
    entry = _Entry()
    entry.pos = pos
    entry.message = message
    return entry


def _pos(entry: _Entry) -> int:
    return entry.pos


class ConversationBuffer:
    """A conversation buffer held in memory, with incremental indexes.

    ``append`` costs O(size of the append + unanswered calls), whatever the
    buffer's length: results, declarations and unanswered calls are indexed
    by id (a healing insert into the middle moves list pointers, nothing
    more). It behaves exactly like :func:`flowmem.append`. With
    ``call_ids="per_turn"`` it plans under that call-id policy and holds the
    messages as a store does (re-declared ids under their aliases,
    :mod:`flowmem.call_ids`).
    """

    def __init__(self, messages: Sequence[Message] = (), *,
                 max_messages: int | None = None, call_ids: CallIds = "strict") -> None:
        self.max_messages = check_max_messages(max_messages)
        self._per_turn = check_call_ids(call_ids) == "per_turn"
        self._entries: list[_Entry] = []
        self._results: dict[str, list[_Entry]] = {}  # id -> its results, oldest first
        self._healed: dict[str, bool] = {}  # id -> whether its first result is a placeholder
        self._calls: dict[str, list[tuple[int, int]]] = {}
        self._pending: dict[str, PendingCall] = {}
        # per_turn (flowmem.call_ids): an id declared again -> its newest declaration's id
        self._newest: dict[str, str] = {}
        self._view = BufferView()
        self._next = 0
        self._last: weakref.ref[AppendResult] | None = None
        self._load(canonical_messages(list(messages), where="messages"))

    def _load(self, messages: list[Message]) -> None:
        for message in messages:
            self._push(message)
        self._reindex()

    def _reindex(self) -> None:
        """Derive every index from the entries: O(length), load and edit only."""
        indexes = derive_indexes((e.pos, e.message) for e in self._entries)
        by_pos = {e.pos: e for e in self._entries}
        self._results = {call: [by_pos[p] for p in spots]
                         for call, spots in indexes.results.items()}
        self._healed = {call: is_healed(held[0].message) for call, held in self._results.items()}
        self._calls = indexes.calls
        self._pending = {p.call_id: p for p in indexes.pending}
        newest: dict[str, tuple[int, str]] = {}
        aliased: set[str] = set()
        for call, turns in self._calls.items():
            caller = caller_id(call)
            if caller != call:
                aliased.add(caller)
            held = newest.get(caller)  # by first declaration: a copy moves nothing
            if held is None or held[0] < turns[0][0]:
                newest[caller] = (turns[0][0], call)
        self._newest = {caller: newest[caller][1] for caller in aliased}
        # the planner reads the live indexes (it never changes a view): no copy per append
        self._view = BufferView(self._healed, self._calls, self._pending.values(),
                                self._newest, _Firsts(self))

    def edit(self, position: int, message: Message | None) -> bool:
        """Replace (or with ``None`` delete) the entry at ``position`` (MEM-15 admin path).

        Decided by :func:`~flowmem.entries.edit_entries`; the indexes are derived again, so
        this costs O(length). Returns whether an entry stood at ``position``.
        """
        edited = edit_entries([(e.pos, e.message) for e in self._entries], position, message)
        if edited is None:
            return False
        self._freeze_last()
        self._entries = [_entry(pos, body) for pos, body in edited]
        self._reindex()
        return True

    # -- reading -------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages)

    @property
    def messages(self) -> list[Message]:
        """A copy of the buffer's messages, oldest first."""
        return [json_copy(e.message) for e in self._entries]

    def page(self, *, last: int | None = None,
             before: int | None = None) -> tuple[list[Message], list[int]]:
        """Up to ``last`` messages (all when ``None``) before position ``before``.

        Returns the messages (copies, oldest first) and their positions.
        """
        end = len(self._entries) if before is None else bisect_left(
            self._entries, before, key=_pos)
        start = 0 if last is None else max(0, end - last)
        chosen = self._entries[start:end]
        return [json_copy(e.message) for e in chosen], [e.pos for e in chosen]

    def count_before(self, before: int | None) -> int:
        """How many entries sit before position ``before`` (all when ``None``)."""
        if before is None:
            return len(self._entries)
        return bisect_left(self._entries, before, key=_pos)

    def view(self, incoming: Sequence[Message] = ()) -> BufferView:
        """What the planner needs to know about this buffer (for any ``incoming``).

        The view reads the buffer's live indexes: plan against it before the
        buffer changes again.
        """
        return self._view

    # -- appending -----------------------------------------------------------
    def append(self, incoming: Message | Sequence[Message]) -> AppendResult:
        """Append one message or a list (all or nothing) and report the delta."""
        canonical = canonical_messages(incoming)
        if self._per_turn:  # the call-id policy (flowmem.call_ids): stored ids, aliases kept
            refuse_aliases(canonical)
            canonical = PerTurn(canonical)
        plan = plan_append(self.view(canonical), canonical)
        self.apply(plan, max_messages=self.max_messages)
        result = AppendResult(count=len(self._entries), appended=plan.appended,
                              load=lambda: self.messages)
        self._last = weakref.ref(result)
        return result

    def _freeze_last(self) -> None:
        """Give a still-held result its messages before the buffer changes (O(length))."""
        last = self._last() if self._last is not None else None
        if last is not None:
            last.freeze()
        self._last = None

    def apply(self, plan: AppendPlan, *, max_messages: int | None) -> int:
        """Execute a plan, then the window; returns the buffer's length after it."""
        if self._last is not None:
            self._freeze_last()
        ops = plan.ops
        if len(ops) == 1 and type(ops[0]) is AddEntry:
            self._add(ops[0])  # the common plan: one new entry
        else:
            self._apply_ops(ops)
        if max_messages is not None:
            self._evict(len(self._entries) - max_messages)
        return len(self._entries)

    def _apply_ops(self, ops: Sequence[Op]) -> None:
        added: dict[int, int] = {}
        for op in ops:
            if isinstance(op, AddEntry):
                added[op.ordinal] = self._add(op)
            elif isinstance(op, ReplacePlaceholder):
                self._results[op.call_id][0].message = op.message
                self._healed[op.call_id] = is_healed(op.message)
            elif isinstance(op, HealTurn):
                self._heal(_resolve(op.turn, added), op.call_ids)

    def _push(self, message: Message) -> int:
        pos = self._next
        self._next += SLOT
        self._entries.append(_entry(pos, message))
        return pos

    def _add(self, op: AddEntry) -> int:
        pos = self._next
        self._next += SLOT
        entry = _Entry()  # _entry, inlined: this runs per append
        entry.pos = pos
        entry.message = op.message
        self._entries.append(entry)
        if op.answers is not None:
            self._results[op.answers] = [entry]
            self._healed[op.answers] = op.healed
            self._pending.pop(op.answers, None)
        if op.declares:
            for order, call in enumerate(op.declares):
                turns = self._calls.get(call)
                if turns is not None:
                    turns.append((pos, order))  # a copy: the id's newest stays
                    continue
                self._calls[call] = [(pos, order)]
                if _SEP in call or call in self._newest:  # per_turn: the id's newest
                    self._newest[caller_id(call)] = call
            for call, order in op.opens:
                if call not in self._pending:
                    self._pending[call] = new_pending(call, pos, order)
        return pos

    def _find(self, pos: int) -> int:
        index = bisect_left(self._entries, pos, key=_pos)
        if index == len(self._entries) or self._entries[index].pos != pos:
            raise LookupError(f"no entry at position {pos}")
        return index

    def _heal(self, turn: int, call_ids: tuple[str, ...]) -> None:
        end = self._find(turn)
        while end + 1 < len(self._entries) and self._entries[end + 1].message["role"] == "tool":
            end += 1
        base = self._entries[end].pos
        for offset, call in enumerate(call_ids, start=1):
            entry = _entry(base + offset, healed_placeholder(call))
            self._entries.insert(end + offset, entry)
            self._results[call] = [entry]
            self._healed[call] = True
            self._pending.pop(call, None)

    def _evict(self, excess: int) -> None:
        if excess <= 0:
            return
        victims = self._entries[:excess]
        del self._entries[:excess]
        cutoff = victims[-1].pos
        affected: set[str] = set()
        for victim in victims:
            answered = result_id(victim.message)
            if answered is not None and self._unindex_result(answered, victim):
                affected.add(answered)
        for victim in victims:
            for call in declared_call_ids(victim.message):
                affected.add(call)
                remaining = [t for t in self._calls.get(call, ()) if t[0] > cutoff]
                if remaining:
                    self._calls[call] = remaining
                else:
                    self._calls.pop(call, None)
                    self._evict_result(call)
                    if self._newest.get(caller_id(call)) == call:
                        del self._newest[caller_id(call)]
        for call in affected:
            self._recompute_pending(call)

    def _unindex_result(self, call: str, entry: _Entry) -> bool:
        held = self._results.get(call)
        if held is None or entry not in held:
            return False
        held.remove(entry)
        if held:
            self._healed[call] = is_healed(held[0].message)
        else:
            del self._results[call]
            del self._healed[call]
        return True

    def _evict_result(self, call: str) -> None:
        self._healed.pop(call, None)
        for entry in self._results.pop(call, ()):
            del self._entries[self._find(entry.pos)]

    def _recompute_pending(self, call: str) -> None:
        turns = self._calls.get(call)
        if turns and call not in self._results:
            pos, order = min(turns)
            self._pending[call] = PendingCall(call, pos, order)
        else:
            self._pending.pop(call, None)


_SEP: Final = "\x1f"  # the separator of a per_turn alias (flowmem.call_ids)


class _Firsts(Mapping[str, Message]):
    """The turn of each id's first declaration, read from the live buffer (the view's
    ``firsts``, :class:`~flowmem.plan.BufferView`)."""

    __slots__ = ("_buffer",)

    def __init__(self, buffer: ConversationBuffer) -> None:
        self._buffer = buffer

    def __getitem__(self, call: str) -> Message:
        buffer = self._buffer
        turns = buffer._calls.get(call)
        if not turns:
            raise KeyError(call)
        return buffer._entries[buffer._find(turns[0][0])].message

    def __iter__(self) -> Iterator[str]:
        return iter(self._buffer._calls)

    def __len__(self) -> int:
        return len(self._buffer._calls)


def _resolve(turn: TurnRef, added: dict[int, int]) -> int:
    return added[turn.ordinal] if isinstance(turn, NewTurn) else turn


def append(buffer: Sequence[Message], incoming: Message | Sequence[Message], *,
           max_messages: int | None = None) -> AppendResult:
    """Append ``incoming`` to ``buffer`` and return the new buffer and the delta.

    Pure: ``buffer`` (a list of message dicts, canonical or provider-flat) is
    not mutated; ``incoming`` is one message dict or a list of them, validated
    strictly — an invalid message raises :class:`~flowmem.errors.InvalidMessage`
    naming its index and field, and nothing is appended.
    """
    work = ConversationBuffer(buffer, max_messages=max_messages)
    result = work.append(incoming)
    return AppendResult(count=result.count, appended=result.appended,
                        messages=[e.message for e in work._entries])
