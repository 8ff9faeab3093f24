"""The newest entries of the conversations a PostgreSQL store appends to, kept by the store.

An append asked for its tail (``append(..., tail=N)``: the service's echo) reads
the conversation's newest ``N`` entries in its last round trip. A store that
made the conversation's last change itself already knows them: the entries it
read or wrote then, plus what this append adds. So the store keeps, per
conversation, its newest entries (:class:`Tails`, at most :data:`KEEP` of
them) with the *stamp* of the conversation's row as that change left it, and an
append whose row still has that stamp reads no tail.

The stamp is the row's ``xmin`` (the transaction that wrote its current
version), its count and its next position. Every change of a conversation's
entries writes its row — an append updates the count and next position, an
edit the count, a deletion, an expiry or an erasure deletes the row — and an
append reads the row ``FOR UPDATE`` in its first round trip, with its own
transaction id (``pg_current_xact_id()``). The row's version an append leaves
has that transaction's id as its ``xmin`` (no savepoint: the append's writes are
its top transaction's). So a row read with the stamp remembered is the very
version this store's append left, and, under the row lock, nothing has changed
the entries since: any other writer, of this process or another, would have
written the row. Count and next position must match too, so an ``xmin`` seen
again after transaction ids wrapped around (2^32 later) is not enough.

Only appends that just add entries keep a tail known (nothing healed or replaced
inside it, nothing evicted by the window: the rest read it, as before, and forget
the copy). A copy changes only once the append's last round trip, which carries
its ``COMMIT``, succeeded. Bound: :data:`CAPACITY` conversations and
:data:`BUDGET` characters of entries per store, least recently used out first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Final

from ...pages import UNPARSED
from ...plan import SLOT, AppendPlan, BufferView
from ...store import HistoryPage
from ..sql._apply import IN_ROW, Applied, PendingInRow, Then, apply_plan
from ..sql._program import Program, Rows, Statement
from ._programs import PostgresConversations

__all__ = ["BUDGET", "CAPACITY", "KEEP", "TailPrograms", "Tails"]

KEEP: Final = 100
"""The newest entries kept per conversation (a tail asked for is at most this long to
be served from the copy once the conversation is longer)."""
CAPACITY: Final = 1024
"""Conversations whose tails one store keeps."""
BUDGET: Final = 16 * 1024 * 1024
"""Characters of stored JSON one store keeps, all conversations together."""

Stamp = tuple[str, int, int]
"""A conversation row's ``xmin`` (as text), count and next position."""
Entries = tuple[tuple[int, str], ...]
"""Positions and stored JSON texts, oldest first."""


class Tails:
    """One store's copies of its conversations' newest entries (thread-safe)."""

    def __init__(self, capacity: int = CAPACITY, budget: int = BUDGET) -> None:
        self.capacity, self.budget = capacity, budget
        self._copies: OrderedDict[int, tuple[Stamp, Entries, int]] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def get(self, buffer_id: int, stamp: Stamp) -> Entries | None:
        """The entries of ``buffer_id`` if its row's stamp is ``stamp``, else ``None``."""
        with self._lock:
            copy = self._copies.get(buffer_id)
            if copy is None or copy[0] != stamp:
                return None
            self._copies.move_to_end(buffer_id)
            return copy[1]

    def put(self, buffer_id: int, stamp: Stamp, entries: Entries) -> None:
        """Keep ``entries`` as ``buffer_id``'s newest, its row left with ``stamp``."""
        size = sum(len(text) for _, text in entries)
        with self._lock:
            self._forget(buffer_id)
            if size > self.budget:
                return
            self._copies[buffer_id] = (stamp, entries, size)
            self._size += size
            while len(self._copies) > self.capacity or self._size > self.budget:
                self._size -= self._copies.popitem(last=False)[1][2]

    def drop(self, buffer_id: int) -> None:
        with self._lock:
            self._forget(buffer_id)

    def _forget(self, buffer_id: int) -> None:
        copy = self._copies.pop(buffer_id, None)
        if copy is not None:
            self._size -= copy[2]


def _page(entries: Entries, last: int, count: int) -> HistoryPage:
    """The newest ``last`` of ``entries`` (the newest of a conversation of ``count``)."""
    kept = entries[-last:]
    positions = [pos for pos, _ in kept]
    older = len(kept) < count
    return HistoryPage(UNPARSED, positions, positions[0] if older and positions else None,
                       count, [text for _, text in kept])


def _serves(entries: Entries | None, last: int, count: int) -> bool:
    """Whether ``entries``, the newest of a conversation of ``count``, will hold its newest
    ``last`` after an append that only adds some: they hold ``last`` already, or all of
    it and ``last`` fits in :data:`KEEP`."""
    return entries is not None and (len(entries) >= last
                                    or (len(entries) == count and last <= KEEP))


class TailPrograms(PostgresConversations):
    """The programs of ONE append, with its store's :class:`Tails` (see the module notes)."""

    def __init__(self, tails: Tails) -> None:
        super().__init__()
        self.tails = tails
        self._row: tuple[int, Stamp, str] | None = None  # id, stamp, this transaction's id
        self._known: Entries | None = None
        self._quiet = False
        self._served = False
        self._after: tuple[int, Stamp, Entries | None] | None = None

    def opened(self, buffer_id: int, stamp: Stamp, xact: str) -> None:
        self._row = (buffer_id, stamp, xact)
        self._known = self.tails.get(buffer_id, stamp)

    def apply(self, buffer_id: int, count: int, next_pos: int, plan: AppendPlan,
              max_messages: int | None, then: Then, view: BufferView) -> Program[Applied]:
        self._quiet = self._row is not None and self._row[0] == buffer_id and not (
            plan.healed or plan.replaced) and (
            max_messages is None or count + plan.appended <= max_messages)
        added: list[tuple[int, str]] = []
        done = yield from apply_plan(buffer_id, count, next_pos, plan, max_messages, then,
                                     PendingInRow.of(view.pending), IN_ROW, added)
        # the last round trip, with the COMMIT, succeeded: the row is as this append left it
        if self._row is None or not self._quiet or done[0] != count + done[1]:
            self.tails.drop(buffer_id)
            self._served = False
            return done
        stamp = (self._row[2], done[0], next_pos + SLOT * done[1])
        entries = None
        if self._known is not None:
            entries = (*self._known, *added)[-max(KEEP, len(self._known)):]
            self.tails.put(buffer_id, stamp, entries)
        self._after = (buffer_id, stamp, entries)
        return done

    def tail_statements(self, buffer_id: int, tail: int) -> list[Statement]:
        """None when the copy serves this append's tail (the append only adds entries)."""
        self._served = (self._quiet and self._row is not None
                        and _serves(self._known, tail, self._row[1][1]))
        return [] if self._served else super().tail_statements(buffer_id, tail)

    def tail_from(self, rows: list[Rows], tail: int, count: int) -> HistoryPage:
        after, self._after = self._after, None
        if self._served and after is not None and after[2] is not None:
            return _page(after[2], tail, count)
        page = super().tail_from(rows, tail, count)
        if after is not None and page.encoded is not None and page.positions:
            self.tails.put(after[0], after[1],
                           tuple(zip(page.positions, page.encoded, strict=True)))
        return page
