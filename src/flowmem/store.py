"""The storage seam: the one small protocol every backend implements.

A store keeps, per :class:`~flowmem.scopes.StorageKey`, either a plain JSON
value or a conversation buffer (one row/entry per message). It never decides
a GR-MEM rule: an append asks :mod:`flowmem.plan` for a plan against a
:class:`~flowmem.plan.BufferView` it builds with indexed look-ups, applies it
in one atomic unit of the backend (a transaction, a script), then applies the
window exactly as :mod:`flowmem.buffer` documents. Scope refusals never reach
a store (MEM-7): :class:`~flowmem.Memory` decides them first.

Two faces, one contract (as httpx has ``BaseTransport`` and
``AsyncBaseTransport``): :class:`Store` is called by :class:`~flowmem.Memory`,
:class:`AsyncStore` by :class:`~flowmem.AsyncMemory`, with the same methods,
arguments, results and errors — the async ones are coroutines and their
``lock`` is an async context manager. A backend keeps its rules in pure or
sans-I/O code both faces share (:mod:`flowmem.stores.sql._conversations` programs, the Redis
scripts) and differs between faces only in how it does I/O.

Every backend runs the public conformance suite in :mod:`flowmem.testing`,
on both faces.

The faces share one coordinator (:mod:`flowmem.coordinator`), whose operations
name the call they need as a :class:`StoreCall` (method, arguments, keywords);
the blocking face makes it on a :class:`Store`, the asyncio face awaits it on an
:class:`AsyncStore`.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar, runtime_checkable

from ._frozen import quick_init
from .messages import Message
from .pages import parse_on_read
from .plan import AppendPlan
from .scopes import StorageKey

if TYPE_CHECKING:
    from .retention import Expiry

__all__ = ["AppendOutcome", "AppendStats", "AsyncStore", "DeleteOutcome", "Erased", "HistoryPage",
           "Idempotency", "Store", "plan_stats"]


@quick_init
@dataclass(frozen=True, slots=True)
class AppendStats:
    """What an append's plan did besides adding entries (for metrics, never for rules).

    ``dropped_results``: incoming tool results dropped as duplicates (MEM-1);
    ``dropped_turns``: assistant turns dropped (MEM-2); ``healed``: placeholders
    inserted (MEM-3); ``replaced``: placeholders overwritten (MEM-10).
    """

    dropped_results: int = 0
    dropped_turns: int = 0
    healed: int = 0
    replaced: int = 0


_NOTHING_ELSE: Final = AppendStats()


def plan_stats(plan: AppendPlan) -> AppendStats:
    """The :class:`AppendStats` of a plan (one shared instance when it only added)."""
    if plan.dropped_results or plan.dropped_turns or plan.healed or plan.replaced:
        return AppendStats(plan.dropped_results, plan.dropped_turns, plan.healed, plan.replaced)
    return _NOTHING_ELSE


@quick_init
@dataclass(frozen=True, slots=True)
class AppendOutcome:
    """What a store reports for one append.

    ``serialized`` is ``False`` when the MEM-12 lock was not had within the
    bounded wait and the append went ahead unserialized (the backend's own
    atomicity still made it whole). ``replayed`` is ``True`` when an
    idempotency key had already been used for this same append: nothing
    changed and the figures are the first outcome's.

    ``tail``, when the append was asked for one (``tail=N``), is the page of
    the newest ``N`` entries as the append left them, read in the append's
    own atomic unit (its transaction, its script): what ``history(key,
    last=N)`` would have answered at that instant, no other writer between.
    ``None`` when not asked.
    """

    count: int
    appended: int
    serialized: bool = True
    stats: AppendStats = field(default_factory=AppendStats)
    replayed: bool = False
    tail: HistoryPage | None = None


@dataclass(frozen=True, slots=True)
class DeleteOutcome:
    """What a store reports for one delete.

    ``found``: whether the key held anything (a value or a conversation).
    ``replayed`` is ``True`` when an idempotency key had already been used for
    this same delete: nothing changed this time and ``found`` is the first
    call's answer, whatever the key holds now.
    """

    found: bool
    replayed: bool = False


@quick_init
@dataclass(frozen=True, slots=True)
class Idempotency:
    """An idempotency key, as a store records it with the change it guards.

    ``fingerprint`` identifies the operation and its input (the coordinator
    computes it); a repeat with the same key and fingerprint replays the
    recorded outcome and changes nothing, a repeat with another fingerprint
    raises :class:`~flowmem.errors.IdempotencyConflict`. The record lives at
    least ``ttl`` seconds after ``now`` (seconds since the epoch).
    """

    key: str
    fingerprint: str
    ttl: float
    now: float


@parse_on_read
@quick_init
@dataclass(frozen=True, slots=True)
class HistoryPage:
    """A page of a conversation, oldest first.

    ``positions`` are the entries' stable positions (an entry keeps its
    position for life). ``before`` is the cursor for the next older page, or
    ``None`` when nothing older remains. ``total`` is how many entries
    sit before ``before`` (the whole conversation without it: the buffer's own
    count); ``None`` from a store that does not count.

    ``encoded``, when a store gives it, is each message's JSON text as the
    store holds it (compact and ASCII-only, as the SQL and Redis stores
    write bodies), in the same order: what a server can send on without
    encoding the messages again. It says nothing the messages do not, and
    takes no part in comparisons. A store that gives it may leave
    ``messages`` :data:`~flowmem.pages.UNPARSED`: they are parsed from it when
    first read.
    """

    messages: list[Message] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    before: int | None = None
    total: int | None = None
    encoded: list[str] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Erased:
    """What a store's :meth:`Store.erase` deleted (with ``dry_run``: would delete).

    Counts only, never content: the scope id's conversations and plain values,
    the conversations' messages, and the idempotency records kept for any of them.
    """

    conversations: int = 0
    values: int = 0
    messages: int = 0
    idempotency_records: int = 0

    def __add__(self, other: Erased) -> Erased:
        return Erased(self.conversations + other.conversations, self.values + other.values,
                      self.messages + other.messages,
                      self.idempotency_records + other.idempotency_records)


@runtime_checkable
class Store(Protocol):
    """A storage backend. All methods are safe to call from several threads."""

    def read(self, key: StorageKey) -> tuple[bool, Any]:
        """``(found, value)``; a conversation's value is its message list."""
        ...

    def write(self, key: StorageKey, value: Any, *,
              idempotency: Idempotency | None = None, replace: bool = False) -> bool | None:
        """Store a JSON value (already validated), replacing the key's earlier value.

        A key that holds a conversation raises :class:`~flowmem.errors.KeyConflict`
        and changes nothing, decided in the same atomic unit as the write; with
        ``replace=True`` the conversation is dropped and the value takes its place.
        The coordinator passes ``replace`` only when it is true.
        With ``idempotency`` the key is recorded in the same atomic unit as the
        change; a repeat changes nothing (see :class:`Idempotency`) and returns
        ``True`` (replayed); otherwise ``False``, or ``None`` from a store that
        does not say.
        """
        ...

    def delete(self, key: StorageKey, *,
               idempotency: Idempotency | None = None) -> DeleteOutcome:
        """Remove the key (value or conversation); :attr:`DeleteOutcome.found` says
        whether anything was there.

        With ``idempotency`` the key is recorded in the same atomic unit as the
        change; a repeat changes nothing and returns the first ``found`` with
        ``replayed=True`` (decided in that same unit).
        """
        ...

    def append(self, key: StorageKey, incoming: Sequence[Message], *,
               max_messages: int | None, lock_timeout: float,
               idempotency: Idempotency | None = None, tail: int = 0) -> AppendOutcome:
        """Append canonical messages to the conversation at ``key`` (created on demand).

        Serialized per key for at most ``lock_timeout`` seconds of waiting
        (MEM-12); past it the append proceeds unserialized and reports
        ``serialized=False``. Raises :class:`~flowmem.errors.KeyConflict` when
        the key holds a plain value. A repeat under the same ``idempotency`` key
        returns the first outcome with ``replayed=True`` and changes nothing.
        ``tail > 0``: the outcome carries the newest ``tail`` entries after the
        append, read in the same atomic unit (:attr:`AppendOutcome.tail`; a
        replayed append's tail is the conversation as it is now). The
        coordinator passes ``tail`` only when it is asked for one.
        """
        ...

    def history(self, key: StorageKey, *, last: int | None = None,
                before: int | None = None) -> HistoryPage:
        """Up to ``last`` messages (all when ``None``) older than position ``before``.

        Raises :class:`~flowmem.errors.KeyConflict` when the key holds a plain value
        (as :meth:`append` does).
        """
        ...

    def edit(self, key: StorageKey, position: int, message: Message | None) -> bool:
        """Replace (or with ``None`` delete) the entry at ``position``.

        The administrative path (MEM-15): the store re-derives the buffer's
        indexes, so it may cost O(length). Returns whether the entry existed.
        """
        ...

    def keys(self, scope: str, scope_id: str, *, prefix: str = "",
             after: str | None = None, limit: int = 100) -> list[str]:
        """Keys (values and conversations) under one scope id, sorted, paged by ``after``."""
        ...

    def erase(self, scope: str, scope_id: str, *, dry_run: bool = False) -> Erased:
        """Delete every key (values and conversations) under one identity scope id
        (``user`` or ``session``), and the idempotency records kept for them.

        Safe under concurrent appends and writes: while it runs the scope id is
        *fenced* — an append or write that would create a key under it raises
        :class:`~flowmem.errors.ErasureInProgress` and changes nothing — so an
        append that races the erasure is either erased or refused, never left
        behind. Erasing again finds nothing (zero counts). ``dry_run`` counts
        what would go and changes nothing.
        """
        ...

    def lock(self, key: StorageKey, timeout: float) -> AbstractContextManager[bool]:
        """The MEM-12 lock of ``key``: yields whether it was had within ``timeout``."""
        ...

    def close(self) -> None:
        """Release connections; the store is unusable afterwards."""
        ...


@runtime_checkable
class AsyncStore(Protocol):
    """The asyncio face of :class:`Store`: the same operations as coroutines.

    No method blocks the event loop: a backend whose driver is blocking runs
    it off the loop (the SQLite store keeps one connection thread per store).
    Cancelling a call leaves the store as if the operation either ran whole
    or not at all, and never leaves a MEM-12 lock held.
    """

    async def read(self, key: StorageKey) -> tuple[bool, Any]:
        """As :meth:`Store.read`."""
        ...

    async def write(self, key: StorageKey, value: Any, *,
                    idempotency: Idempotency | None = None,
                    replace: bool = False) -> bool | None:
        """As :meth:`Store.write`."""
        ...

    async def delete(self, key: StorageKey, *,
                     idempotency: Idempotency | None = None) -> DeleteOutcome:
        """As :meth:`Store.delete`."""
        ...

    async def append(self, key: StorageKey, incoming: Sequence[Message], *,
                     max_messages: int | None, lock_timeout: float,
                     idempotency: Idempotency | None = None, tail: int = 0) -> AppendOutcome:
        """As :meth:`Store.append`; the MEM-12 wait never blocks the loop."""
        ...

    async def history(self, key: StorageKey, *, last: int | None = None,
                      before: int | None = None) -> HistoryPage:
        """As :meth:`Store.history`."""
        ...

    async def edit(self, key: StorageKey, position: int, message: Message | None) -> bool:
        """As :meth:`Store.edit` (the administrative path, MEM-15)."""
        ...

    async def keys(self, scope: str, scope_id: str, *, prefix: str = "",
                   after: str | None = None, limit: int = 100) -> list[str]:
        """As :meth:`Store.keys`."""
        ...

    async def erase(self, scope: str, scope_id: str, *, dry_run: bool = False) -> Erased:
        """As :meth:`Store.erase`."""
        ...

    def lock(self, key: StorageKey, timeout: float) -> AbstractAsyncContextManager[bool]:
        """As :meth:`Store.lock`, as ``async with``."""
        ...

    async def aclose(self) -> None:
        """Release connections; the store is unusable afterwards."""
        ...


# -- how the coordinator names one call of this protocol (flowmem.coordinator) -------------


class StoreCall:
    """One store method call an operation needs: ``store.<method>(*args, **kwargs)``.

    A plain slotted class, not a dataclass: one is built per operation (the hot path).
    """

    __slots__ = ("args", "kwargs", "method")

    def __init__(self, method: str, args: tuple[Any, ...],
                 kwargs: dict[str, Any] | None = None) -> None:
        self.method = method
        self.args = args
        self.kwargs = {} if kwargs is None else kwargs

    def __repr__(self) -> str:
        return f"StoreCall({self.method!r}, {self.args!r}, {self.kwargs!r})"


T = TypeVar("T")
Operation = Generator[StoreCall, Any, T]
"""A coordinator operation: yields store calls, receives their answers, returns the result."""


def idempotency_keyword(idempotency: Idempotency | None) -> dict[str, Idempotency]:
    """The ``idempotency`` keyword of a store call (none without a key)."""
    return {} if idempotency is None else {"idempotency": idempotency}


def extras(tail: int | None, expiry: Expiry | None) -> dict[str, Any]:
    """The optional keywords of a store's append: each passed only when it says something."""
    keywords: dict[str, Any] = {}
    if tail:
        keywords["tail"] = tail
    if expiry is not None:
        keywords["expiry"] = expiry
    return keywords
