"""What the coordinator's operations return, on both faces (:class:`~flowmem.Memory`
and :class:`~flowmem.AsyncMemory`): the same types, the same fields.

:class:`AppendResult` is the pure append's report (MEM-14, :func:`flowmem.append`,
re-exported by :mod:`flowmem.buffer`); a memory's append extends it
(:class:`ScopedAppendResult`). Every result of a memory says where it acted
(``scope``, ``resolved_scope_id``) and whether the scope was refused (MEM-7:
``refused=True``, nothing reached a backend, ``resolved_scope_id == ""``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from .call_ids import caller_messages
from .errors import MessagesNotLoaded
from .messages import Message
from .pages import UNPARSED, parse_on_read, unparsed
from .store import AppendStats

__all__ = [
    "DeleteResult",
    "HistoryResult",
    "ReadResult",
    "ScopedAppendResult",
    "WriteResult",
    "appended_result",
]


class AppendResult:
    """What an append reports (MEM-14).

    ``count`` is the buffer's size after the append (window applied),
    ``appended`` how many incoming messages became new entries (dropped
    duplicates and placeholder replacements count zero; a message added and
    then evicted by the same append still counts), ``appended_any`` whether
    that is more than zero. ``messages`` is the buffer after the append. A
    :class:`ConversationBuffer` produces it on first access, or just before
    its next change if the result is still held, so it is always the buffer
    as this append left it; a store-backed result (:class:`flowmem.Memory`)
    reads it from the store on first access.
    """

    __slots__ = ("__weakref__", "_load", "_messages", "appended", "count")

    def __init__(self, *, count: int, appended: int, messages: list[Message] | None = None,
                 load: Callable[[], list[Message]] | None = None) -> None:
        if messages is None and load is None:
            raise ValueError("AppendResult needs messages or a loader")
        self.count = count
        self.appended = appended
        self._messages = messages
        self._load = load

    @property
    def appended_any(self) -> bool:
        """``appended > 0``."""
        return self.appended > 0

    @property
    def messages(self) -> list[Message]:
        """The buffer after the append, in the canonical shape."""
        if self._messages is None:
            assert self._load is not None
            self._messages = self._load()
        return self._messages

    def freeze(self) -> None:
        """Load ``messages`` now (a stateful buffer calls this before it changes)."""
        _ = self.messages

    def to_dict(self) -> dict[str, Any]:
        """``{"count", "appended", "appended_any"}`` — the MEM-14 report."""
        return {"count": self.count, "appended": self.appended,
                "appended_any": self.appended_any}

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(count={self.count}, appended={self.appended}, "
                f"appended_any={self.appended_any})")


@dataclass(frozen=True, slots=True)
class ReadResult:
    """A read: the value (or the default), whether the key was found, and where."""

    value: Any
    found: bool
    scope: str
    resolved_scope_id: str
    refused: bool = False


@dataclass(frozen=True, slots=True)
class WriteResult:
    """A write: whether it took effect, and where; ``replayed`` when its idempotency key
    had already been used for this same write (nothing changed this time)."""

    ok: bool
    scope: str
    resolved_scope_id: str
    refused: bool = False
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class DeleteResult:
    """A delete: ``ok`` unless refused; ``found`` whether anything was there.

    ``replayed`` when its idempotency key had already been used for this same
    delete: nothing changed this time and ``found`` is the first call's answer."""

    ok: bool
    found: bool
    scope: str
    resolved_scope_id: str
    refused: bool = False
    replayed: bool = False


@parse_on_read
@dataclass(frozen=True, slots=True)
class HistoryResult:
    """A page of a conversation, oldest first; ``before`` pages further back.

    ``total`` counts the entries before ``before`` (the whole conversation
    without it; ``None`` where the store does not count). A read under a token
    budget (``max_tokens``) also says how many tokens its messages hold
    (``tokens``) and how many stored messages it left out (``omitted``);
    both are ``None`` otherwise. ``encoded`` is the
    store's JSON text of each message when it gave it
    (:class:`~flowmem.store.HistoryPage`); it takes no part in comparisons, and
    ``messages`` is parsed from it when first read (:mod:`flowmem.pages`).
    """

    messages: list[Message] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    before: int | None = None
    scope: str = ""
    resolved_scope_id: str = ""
    refused: bool = False
    total: int | None = None
    encoded: list[str] | None = field(default=None, compare=False, repr=False)
    tokens: int | None = None
    omitted: int | None = None

    @classmethod
    def of_page(cls, page: Any, scope: str, resolved_scope_id: str) -> HistoryResult:
        """A store's page for the caller, its messages still unparsed if they were."""
        return cls(unparsed(page), page.positions, page.before, scope, resolved_scope_id,
                   total=page.total, encoded=page.encoded)

    def kept(self, count: int) -> HistoryResult:
        """The first ``count`` entries (unparsed if they were); ``before`` only if any."""
        messages = unparsed(self)
        return HistoryResult(messages if messages is UNPARSED else messages[:count],
                             self.positions[:count], self.before if count else None,
                             self.scope, self.resolved_scope_id, self.refused, self.total,
                             None if self.encoded is None else self.encoded[:count])


def _not_loaded() -> NoReturn:
    raise MessagesNotLoaded("the buffer of an AsyncMemory append is read on request: "
                            "use `await result.load_messages()`")


class ScopedAppendResult(AppendResult):
    """The core :class:`~flowmem.AppendResult` (MEM-14) plus where it was appended.

    ``replayed`` is ``True`` when the call repeated an idempotency key: the
    figures are the first call's and nothing changed.
    ``tail``, when the append was asked for one (``tail=N``), is the page of
    the newest ``N`` entries just after it, read in the append's own
    transaction (no other writer between); ``None`` when not asked. A
    refused append's tail is an empty refused page.
    Beside the MEM-14 delta (``count``, ``appended``, ``appended_any``, kept
    exactly as the rule says), the breakdown tells apart what ``appended: 0``
    alone cannot: ``replaced`` late results stored in place of their
    placeholders (MEM-10), ``dropped_results`` tool results dropped as
    duplicates (MEM-1), ``dropped_turns`` assistant turns dropped because
    every call id they declare was already declared (MEM-2), and ``healed``
    placeholders inserted (MEM-3). A replayed append reports the first call's
    delta and a zero breakdown. ``refused`` is in the repr and in
    :meth:`to_dict`, always.
    ``messages`` (the buffer after the append) is read from the store on
    first access by a :class:`~flowmem.Memory` result; an
    :class:`~flowmem.AsyncMemory` result reads it with
    ``await result.load_messages()`` (a property cannot await).
    """

    __slots__ = ("_aload", "refused", "replayed", "resolved_scope_id", "scope", "serialized",
                 "stats", "tail")

    scope: str
    resolved_scope_id: str
    serialized: bool
    refused: bool
    replayed: bool
    tail: HistoryResult | None
    stats: AppendStats
    _aload: Callable[[], Awaitable[list[Message]]] | None

    def __init__(self, *, scope: str, resolved_scope_id: str, count: int, appended: int,
                 serialized: bool = True, refused: bool = False, replayed: bool = False,
                 messages: list[Message] | None = None,
                 load: Callable[[], list[Message]] | None = None,
                 aload: Callable[[], Awaitable[list[Message]]] | None = None,
                 tail: HistoryResult | None = None, stats: AppendStats | None = None) -> None:
        if aload is not None:
            load = _not_loaded
        elif messages is None and load is None:
            raise ValueError("AppendResult needs messages or a loader")
        _fill(self, scope, resolved_scope_id, serialized, count, appended, refused, replayed,
              messages, load, aload, tail, stats or _NO_STATS)

    @property
    def replaced(self) -> int:
        """Late tool results stored in place of their healed placeholders (MEM-10)."""
        return self.stats.replaced

    @property
    def dropped_results(self) -> int:
        """Incoming tool results dropped as duplicates (MEM-1)."""
        return self.stats.dropped_results

    @property
    def dropped_turns(self) -> int:
        """Incoming assistant turns dropped: every call id they declare was known (MEM-2)."""
        return self.stats.dropped_turns

    @property
    def healed(self) -> int:
        """Placeholders inserted for unanswered calls before a user message (MEM-3)."""
        return self.stats.healed

    def to_dict(self) -> dict[str, Any]:
        """The MEM-14 report ``{"count", "appended", "appended_any"}``, then the breakdown
        (``replaced``, ``dropped_results``, ``dropped_turns``, ``healed``) and ``refused``."""
        stats = self.stats
        return {"count": self.count, "appended": self.appended,
                "appended_any": self.appended > 0, "replaced": stats.replaced,
                "dropped_results": stats.dropped_results, "dropped_turns": stats.dropped_turns,
                "healed": stats.healed, "refused": self.refused}

    def __repr__(self) -> str:
        stats = self.stats
        return (f"{type(self).__name__}(count={self.count}, appended={self.appended}, "
                f"appended_any={self.appended > 0}, replaced={stats.replaced}, "
                f"dropped_results={stats.dropped_results}, "
                f"dropped_turns={stats.dropped_turns}, healed={stats.healed}, "
                f"refused={self.refused})")

    async def load_messages(self) -> list[Message]:
        """The buffer after the append, on either face (awaits the read once)."""
        if self._messages is None and self._aload is not None:
            self._messages = await self._aload()
        return self.messages


_new = object.__new__
_NO_STATS = AppendStats()


def _fill(result: ScopedAppendResult, scope: str, resolved_scope_id: str, serialized: bool,
          count: int, appended: int, refused: bool, replayed: bool,
          messages: list[Message] | None, load: Callable[[], list[Message]] | None,
          aload: Callable[[], Awaitable[list[Message]]] | None,
          tail: HistoryResult | None, stats: AppendStats) -> ScopedAppendResult:
    """Set every field of ``result`` (AppendResult's too: one call less per append)."""
    result.count = count
    result.appended = appended
    result._messages = messages
    result._load = load
    result._aload = aload
    result.scope = scope
    result.resolved_scope_id = resolved_scope_id
    result.serialized = serialized
    result.refused = refused
    result.replayed = replayed
    result.tail = tail
    result.stats = stats
    return result


def appended_result(scope: str, resolved_scope_id: str, serialized: bool, count: int,
                    appended: int, replayed: bool,
                    load: Callable[[], list[Message]] | None,
                    aload: Callable[[], Awaitable[list[Message]]] | None,
                    tail: HistoryResult | None = None,
                    stats: AppendStats | None = None) -> ScopedAppendResult:
    """``ScopedAppendResult(...)`` of an append a store answered (one loader given).

    The coordinator's per-append construction: positional, and without the
    constructor's call through ``type`` and its keyword parsing (a third of the cost).
    """
    return _fill(_new(ScopedAppendResult), scope, resolved_scope_id, serialized, count,
                 appended, False, replayed, None,
                 _not_loaded if aload is not None else load, aload, tail,
                 _NO_STATS if stats is None or replayed else stats)


# A per-turn memory's reads (call_ids="per_turn"): a re-declared id is stored
# under an alias, and every read gives the caller back the ids it sent.

Loader = Callable[[], list[Message]]
AsyncLoader = Callable[[], Awaitable[list[Message]]]


def callers_history(result: HistoryResult) -> HistoryResult:
    """A page with the caller's call ids (its stored JSON texts are not passed on)."""
    if result.refused:
        return result
    return HistoryResult(caller_messages(result.messages), result.positions, result.before,
                         result.scope, result.resolved_scope_id, result.refused,
                         result.total, None, result.tokens, result.omitted)


def callers_read(result: ReadResult) -> ReadResult:
    """A read conversation (a list of messages) with the caller's call ids."""
    value = result.value
    if not result.found or not isinstance(value, list):
        return result
    if not all(isinstance(m, dict) and "role" in m for m in value):
        return result
    return ReadResult(caller_messages(value), True, result.scope, result.resolved_scope_id,
                      result.refused)


def callers_loaders(load: Loader | None, aload: AsyncLoader | None,
                    ) -> tuple[Loader | None, AsyncLoader | None]:
    """An append result's loaders, giving the caller's call ids."""
    if load is not None:
        plain = load

        def load_callers() -> list[Message]:
            return caller_messages(plain())

        load = load_callers
    if aload is not None:
        plain_async = aload

        async def aload_callers() -> list[Message]:
            return caller_messages(await plain_async())

        aload = aload_callers
    return load, aload
