"""Hot buffers: a connection's own copy of the planner's view of the buffers it appends to.

The planner (:func:`flowmem.plan.plan_append`) needs, for each append, the
stored results and declarations of the ids it mentions and the unanswered
calls. Read from the tables, that is one statement of indexed look-ups per
append. A connection that is the only writer of a buffer already knows all
of it — it wrote it — so the SQLite store keeps, per connection, the whole
view of its hot buffers and reads none of it on the common append.

The copy is trusted while no other connection has committed: ``PRAGMA
data_version`` (one statement, no table read) changes exactly when another
connection, of this process or another, commits to the database file. It is
read inside the append's ``BEGIN IMMEDIATE`` transaction, under the
database's write lock, so nothing can commit between the check and the
append's own ``COMMIT``. After a change, a copy is checked against its own
buffer's state before it is used: every change of a buffer gives its state a
new random ``version`` (on the buffer's newest entry, :mod:`._state`), which
the copy remembers from its own last write. One more
statement when another connection committed, and the copy is kept when that
commit touched other buffers (another ``--workers`` process's sessions); a
copy whose buffer changed is dropped. A stale copy is therefore never
planned against; the worst case costs a table read, never a wrong decision.

A copy may be *partial*: it knows the facts of some ids only (whether a
result is stored, and whether it is a placeholder; whether the id was
declared), and it knows them exactly — each was read by id under the write
lock while the copy was current, or written by this connection since. A
buffer this connection creates starts empty and complete; an existing one
starts partial at its first append (from the statement that reads its row
and the view of the ids that append mentions, which it reads anyway), and
knows its unanswered calls' facts from the start (declared, no result). It
learns by id only: the short path (:mod:`._append`) plans on a partial copy
first, then reads the view of the ids the plan's new entries answer or
declare that the copy does not know (:meth:`HotBuffer.unknown_in`: any id
the planner looked up and did not find is such an id), and plans again only
when one of them turns out held; an append whose ids are all known reads
nothing. So a process appending to a conversation another one wrote never
reads the whole of it. Bound: at most :data:`CAPACITY` buffers per
connection (least recently used first out).

The copy changes only after the statements of the append succeeded; a
transaction that fails or is rolled back (a group commit's savepoint
included) drops every copy of its connection (:meth:`HotBuffers.clear`).

A hot buffer may also know its newest entries (:attr:`HotBuffer.tail`: up to
:data:`TAIL_KEEP` positions with their stored JSON texts), learned from a tail
this connection read and from the entries it appended since, so an append's
tail (``append(..., tail=N)``, the service's echo) reads no table. What would
move an entry inside it without this connection writing the entry's row
itself — healing (placeholders inside a turn's block), a late result
replacing a placeholder, the window — makes it unknown again; every other way
a buffer changes drops the whole copy (the rules above).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from ..._frozen import quick_new
from ...pages import UNPARSED
from ...plan import (
    SLOT,
    AddEntry,
    AppendPlan,
    BufferView,
    HealTurn,
    PendingCall,
    ReplacePlaceholder,
)
from ...store import HistoryPage

__all__ = ["CAPACITY", "TAIL_KEEP", "HotBuffer", "HotBuffers", "adds_only"]

Key = tuple[str, str, str]

CAPACITY: Final = 64
"""Buffers whose view one connection keeps."""
TAIL_KEEP: Final = 100
"""The newest entries a hot buffer may know (:attr:`HotBuffer.tail`)."""

Tail = deque[tuple[int, str]]


@dataclass(slots=True)
class HotBuffer:
    """One buffer's planner view, as of this connection's last commit: complete, or the
    facts of :attr:`known` ids only (see the module notes)."""

    buffer_id: int
    count: int
    next_pos: int
    results: dict[str, bool] = field(default_factory=dict)
    declared: set[str] = field(default_factory=set)
    pending: dict[str, PendingCall] = field(default_factory=dict)
    tail: Tail | None = None
    """The newest entries, ``(position, JSON text)`` oldest first; ``None``: unknown."""
    version: int = 0
    """The buffer's state's version as this connection last wrote or read it."""
    checked: int | None = None
    """The ``data_version`` at which the copy was last known current."""
    known: set[str] | None = None
    """``None``: the copy is complete; else the ids whose facts it knows."""
    _view: BufferView | None = field(default=None, init=False, repr=False, compare=False)

    def unknown(self, ids: Iterable[str]) -> list[str]:
        """Those of ``ids`` whose facts the copy does not know."""
        known = self.known
        return [] if known is None else [i for i in ids if i not in known]

    def unknown_in(self, plan: AppendPlan) -> list[str]:
        """The ids ``plan``'s new entries answer or declare that the copy does not know.

        A plan made on a partial copy stands when there are none: the planner
        (:mod:`flowmem.plan`) looks up only the ids the append mentions, and every id it
        looks up and does not find becomes the id an entry it adds answers or declares
        (a result not stored is added, a turn declaring an id not declared is kept), so
        an id the copy does not know cannot have changed the plan without showing here.
        """
        known = self.known
        if known is None:
            return []
        ids: list[str] = []
        for op in plan.ops:  # (loops, not comprehensions: this runs per append)
            if type(op) is AddEntry:
                answers = op.answers
                if answers is not None and answers not in known and answers not in ids:
                    ids.append(answers)
                for call in op.declares:
                    if call not in known and call not in ids:
                        ids.append(call)
        return ids

    def holds_any(self, ids: Iterable[str]) -> bool:
        """Whether any of ``ids`` has a stored result or was declared (a plan that took
        them all as neither stands: every look-up it made answers the same)."""
        results, declared = self.results, self.declared
        return any(i in results or i in declared for i in ids)

    def learn(self, ids: Iterable[str], results: dict[str, bool], declared: set[str]) -> None:
        """The facts of ``ids`` (their stored ``results`` and which were ``declared``), read
        by id in a transaction that found the copy current."""
        assert self.known is not None
        self.known.update(ids)
        self.results.update(results)
        self.declared.update(declared)

    def view(self) -> BufferView:
        """The live indexes as a view (the planner only reads them, and only while
        planning: one view serves every append)."""
        view = self._view
        if view is None:
            view = self._view = _new_view(self.results, self.declared, self.pending.values())
        return view

    def page(self, last: int) -> HistoryPage | None:
        """The newest ``last`` entries as a page, or ``None`` when :attr:`tail` does not
        hold them all."""
        tail = self.tail
        if tail is None or (len(tail) < last and len(tail) < self.count):
            return None
        kept = list(tail)[-last:] if last < len(tail) else list(tail)
        positions = [pos for pos, _ in kept]
        older = len(kept) < self.count
        return HistoryPage(UNPARSED, positions, positions[0] if older and positions else None,
                           self.count, [text for _, text in kept])

    def serves(self, last: int) -> bool:
        """Whether :attr:`tail` will hold the newest ``last`` entries after an append that
        only adds entries: it holds them now, or holds the whole buffer and ``last`` fits
        in :data:`TAIL_KEEP` (the added entries may push the oldest out of a full tail)."""
        tail = self.tail
        return tail is not None and (len(tail) >= last
                                     or (len(tail) >= self.count and last <= TAIL_KEEP))

    def learn_tail(self, page: HistoryPage) -> None:
        """The newest entries, from a page just read in this connection's transaction."""
        if page.encoded is not None and page.total == self.count:
            self.tail = deque(zip(page.positions, page.encoded, strict=True),
                              maxlen=TAIL_KEEP)

    def apply(self, plan: AppendPlan, count: int,
              added: Sequence[tuple[int, str]] = ()) -> None:
        """What ``plan`` did, as the SQL executor applied it from :attr:`next_pos`;
        ``added``: the entries it inserted (see :attr:`tail`)."""
        if self.tail is not None:
            if plan.healed or plan.replaced:  # an entry inside the tail may have moved
                self.tail = None
            else:
                self.tail.extend(added)
        pos = self.next_pos
        # A healed or replaced result is written here as it is stored, known or not.
        for op in plan.ops:
            if isinstance(op, AddEntry):
                self._index(op, pos)
                pos += SLOT
            elif isinstance(op, ReplacePlaceholder):
                self.results[op.call_id] = False
            elif isinstance(op, HealTurn):
                for call in op.call_ids:
                    self.results[call] = True
                    self.pending.pop(call, None)
        self.next_pos, self.count = pos, count

    def added(self, op: AddEntry, body: str, version: int, checked: int | None) -> None:
        """:meth:`apply` of a plan whose one operation is ``op``, inserted at
        :attr:`next_pos` as ``body``, that left the state at ``version`` (the short
        path's common append, :mod:`._append`)."""
        pos = self.next_pos
        if self.tail is not None:
            self.tail.append((pos, body))
        if op.answers is not None or op.declares:  # else nothing to index (a call less)
            self._index(op, pos)
        self.next_pos, self.count = pos + SLOT, self.count + 1
        self.version, self.checked = version, checked

    def _index(self, op: AddEntry, pos: int) -> None:
        """The indexes of ``op``'s entry at ``pos``: its answered and declared ids were
        known (the append mentions them)."""
        if op.answers is not None:
            self.results[op.answers] = op.healed
            self.pending.pop(op.answers, None)
        if op.declares:
            self.declared.update(op.declares)
        for call, order in op.opens:
            self.pending[call] = _new_pending(call, pos, order)


_new_view = quick_new(BufferView)
_new_pending = quick_new(PendingCall)


def adds_only(plan: AppendPlan, count: int, max_messages: int | None) -> bool:
    """Whether ``plan`` on a buffer of ``count`` entries only appends: nothing healed or
    replaced inside it, nothing evicted by the window (then a copy's tail stays known)."""
    return not (plan.healed or plan.replaced) and (
        max_messages is None or count + plan.appended <= max_messages)


class HotBuffers:
    """The hot buffers of ONE connection (see the module notes)."""

    def __init__(self) -> None:
        self.version: int | None = None
        self._buffers: OrderedDict[Key, HotBuffer] = OrderedDict()

    def observe(self, data_version: int) -> None:
        """Note the file's data version (read in the append's transaction): a copy checked
        at another one must be checked against its buffer's state before use."""
        self.version = data_version

    def current(self, buffer: HotBuffer) -> bool:
        """Whether ``buffer`` is known current (no other connection committed since)."""
        return buffer.checked == self.version

    def clear(self) -> None:
        """Forget everything (a failed or rolled-back transaction, a non-append write)."""
        self._buffers.clear()

    def get(self, key: Key) -> HotBuffer | None:
        buffer = self._buffers.get(key)
        if buffer is not None:
            self._buffers.move_to_end(key)
        return buffer

    def keep(self, key: Key, buffer: HotBuffer) -> HotBuffer:
        """Start keeping ``buffer`` (the least recently used one leaves when full)."""
        self._buffers[key] = buffer
        self._buffers.move_to_end(key)
        if len(self._buffers) > CAPACITY:
            self._buffers.popitem(last=False)
        return buffer

    def drop(self, key: Key) -> None:
        self._buffers.pop(key, None)
