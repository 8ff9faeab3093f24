"""The coordinator's logic, once for both faces (sans-I/O, as httpx and h11 do it).

Each operation of :class:`~flowmem.Memory` and :class:`~flowmem.AsyncMemory`
is written here ONCE as a generator (the append as two halves around the
face's own store call, :meth:`MemoryCore._append_call` and
:meth:`MemoryCore._append_result`): it validates the input, resolves the
scope — the ONE place a refusal is acted on (MEM-7) — yields the
:class:`~flowmem.store.StoreCall` it needs and builds the result from the
answer. The blocking face runs the call on a :class:`~flowmem.store.Store`,
the asyncio face awaits it on an :class:`~flowmem.store.AsyncStore`; that is
all they differ in. Under a refused scope the operation returns its neutral
result without yielding at all, so no backend is ever called, and logs exactly
one warning on the ``flowmem`` logger naming the node, pipeline and workflow.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

from .buffer import check_max_messages
from .call_ids import (
    CallIds,
    PerTurn,
    caller_messages,
    check_call_ids,
    refuse_aliases,
    stored_edit,
)
from .errors import InvalidInput, ScopeRefused
from .formats import to_canonical
from .messages import Message, canonical_message, canonical_messages, json_copy
from .metrics import Metrics
from .results import (
    AsyncLoader,
    DeleteResult,
    HistoryResult,
    Loader,
    ReadResult,
    ScopedAppendResult,
    WriteResult,
    appended_result,
    callers_history,
    callers_loaders,
    callers_read,
)
from .retention import Expiry, Retention, Swept, parse_retention
from .scopes import (
    MAX_KEY_LENGTH,
    ExecutionContext,
    StorageKey,
    check_cursor,
    check_idempotency_key,
    check_key,
    check_limit,
    idempotency_prefix,
    resolve_scope,
)
from .store import (
    AppendOutcome,
    DeleteOutcome,
    Idempotency,
    Operation,
    StoreCall,
    extras,
    idempotency_keyword,
)

__all__ = [
    "DEFAULT_IDEMPOTENCY_TTL",
    "DEFAULT_LOCK_TIMEOUT",
    "MAX_KEY_LENGTH",
    "MemoryCore",
    "Operation",
    "StoreCall",
    "extras",
]

logger = logging.getLogger("flowmem")

DEFAULT_LOCK_TIMEOUT: Final = 5.0
DEFAULT_IDEMPOTENCY_TTL: Final = 24 * 3600.0
_DATED: Final = frozenset({"read", "history", "keys"})

T = TypeVar("T")
_Face = TypeVar("_Face", bound="MemoryCore")


def _named(value: object) -> str:
    """An id of the execution context as a warning shows it: quoted, or ``-`` when absent."""
    return "-" if value is None or value == "" else repr(value)


PreparedAppend = tuple[StorageKey, list[Message], int | None, Idempotency | None,
                       Expiry | None]
"""A located, validated append, its store call's arguments: where, the canonical
messages, the window, the idempotency, the expiry its scope's policy sets."""


_NO_CONTEXT: Final = object()


def _fingerprint(operation: str, where: StorageKey, payload: Any) -> str:
    """What a retry must repeat exactly: the operation, where, and its canonical input."""
    text = json.dumps([operation, where.scope, where.scope_id, where.key, payload],
                      ensure_ascii=True, separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


class MemoryCore:
    """Validation, the refusal decision and the result builders of both faces.

    ``lock_timeout`` bounds the MEM-12 wait for a conversation's lock (past
    it the append goes ahead unserialized, logs one warning, and is still
    made whole by the backend's own atomicity). ``idempotency_ttl`` is how
    long, at least, an idempotency key is remembered (seconds; 24 h).
    ``retention``: a :class:`~flowmem.retention.Retention` or its spelling
    (:func:`~flowmem.retention.parse_retention`); ``clock``: seconds since the
    epoch, what expiry is decided against (tests inject one).
    ``call_ids`` is the call-id policy (:mod:`flowmem.call_ids`): ``"strict"``
    (MEM-2 as written) or ``"per_turn"`` (a re-declared id starts a new
    declaration); a per-turn memory gives the caller's ids back on every read.
    """

    def __init__(self, *, lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
                 idempotency_ttl: float = DEFAULT_IDEMPOTENCY_TTL,
                 metrics: Metrics | None = None, backend: str = "",
                 retention: Any = None, clock: Callable[[], float] = time.time,
                 call_ids: CallIds = "strict") -> None:
        self.call_ids: CallIds = check_call_ids(call_ids)
        self._per_turn = self.call_ids == "per_turn"
        self.lock_timeout = lock_timeout
        self.idempotency_ttl = idempotency_ttl
        self.metrics = metrics
        self.backend = backend
        self.retention: Retention | None = parse_retention(retention)
        if not callable(clock):
            raise InvalidInput(f"clock must be a callable returning seconds, got {clock!r}")
        self.clock = clock
        # the last successful resolution (scope, key, context, where); see _locate
        self._last_where: tuple[str, str, object, StorageKey | None] = ("", "", _NO_CONTEXT, None)
        self._loaders: tuple[StorageKey | None, Loader | None, AsyncLoader | None] = (
            None, None, None)

    def with_call_ids(self: _Face, call_ids: CallIds) -> _Face:
        """This memory under the call-id policy ``call_ids`` (itself when it has it): the
        same store, connections and metrics (closing either closes the store)."""
        policy = check_call_ids(call_ids)
        if policy == self.call_ids:
            return self
        twin = copy.copy(self)
        twin.call_ids, twin._per_turn = policy, policy == "per_turn"
        twin._loaders = (None, None, None)  # an append result's loaders follow the policy
        return twin

    def _idempotency(self, idempotency_key: str | None, operation: str, where: StorageKey,
                     payload: Any) -> Idempotency | None:
        """The store's ``idempotency`` argument for a key (``None`` without one)."""
        if idempotency_key is None:
            return None
        check_idempotency_key(idempotency_key)
        # Scoped to the storage key it names: the same key on another conversation
        # or value is another operation, on every backend (PostgreSQL and Redis
        # Cluster keep the record beside the conversation, on its shard or slot).
        scoped = idempotency_prefix(where) + idempotency_key
        return Idempotency(scoped, _fingerprint(operation, where, payload),
                           self.idempotency_ttl, self.clock())

    # -- retention (the decisions: flowmem.retention) ----------------------------
    def _dated(self, call: StoreCall) -> None:
        """A read, history or key listing under retention is asked at the clock's ``now``
        (every such call of every operation, the context reads included; a store without
        retention is never asked about it)."""
        if self.retention is not None and call.method in _DATED:
            call.kwargs["now"] = self.clock()

    def _expiry(self, scope: str) -> Expiry | None:
        return None if self.retention is None else self.retention.expiry(scope, self.clock())

    def _refreshed(self, where: StorageKey) -> Operation[None]:
        """After a found read under an idle policy with ``refresh_on_read``: move its expiry."""
        if self.retention is not None:
            expiry = self.retention.refresh(where.scope, self.clock())
            if expiry is not None:
                yield StoreCall("touch", (where, expiry))

    def _sweep(self, batch: int) -> Operation[Swept]:
        """One batch of the sweep: up to ``batch`` expired conversations and values
        deleted in one short transaction (or script) of the store."""
        if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 10_000:
            raise InvalidInput(f"batch must be an integer in [1, 10000], got {batch!r}")
        swept: Swept = yield StoreCall("sweep", (self.clock(),), {"batch": batch})
        if self.metrics is not None:
            self.metrics.swept(self.backend, swept.by_scope)
        return swept

    # -- the one refusal decision (MEM-6, MEM-7, MEM-13) --------------------
    def _locate(self, operation: str, scope: str, key: Any,
                context: ExecutionContext | None) -> StorageKey | None:
        last = self._last_where
        if last[2] is context and last[0] is scope and last[1] == key and type(key) is str:
            return last[3]  # the same key under the same (frozen) context: resolved before
        checked = check_key(key)
        scope_id = self._scope_id(operation, scope, context, checked)
        if scope_id is None:
            return None
        where = StorageKey(scope, scope_id, checked)
        if type(context) is ExecutionContext and type(key) is str:
            # an ExecutionContext is frozen and its ids are str/int, so the same
            # object resolves the same way again; other context objects are not cached
            self._last_where = (scope, key, context, where)
        return where

    def _scope_id(self, operation: str, scope: str, context: ExecutionContext | None,
                  what: str) -> str | None:
        try:
            return resolve_scope(scope, context)
        except ScopeRefused as refusal:
            if self.metrics is not None:
                self.metrics.refused(operation)
            logger.warning(  # MEM-7: one warning naming node, pipeline and workflow
                "flowmem: %s of %r refused (%s); node %s, pipeline %s, workflow %s",
                operation, what, refusal.reason, *(_named(getattr(context, name, None)) for name
                                                   in ("node_id", "pipeline_id", "workflow_id")),
            )
            return None

    # -- operations -------------------------------------------------------------
    def _read(self, scope: str, key: str, context: ExecutionContext | None,
              default: Any) -> Operation[ReadResult]:
        where = self._locate("read", scope, key, context)
        if where is None:
            return ReadResult(default, False, scope, "", refused=True)
        found, value = yield StoreCall("read", (where,))
        if found:
            yield from self._refreshed(where)
        read = ReadResult(value if found else default, found, scope, where.scope_id)
        return callers_read(read) if self._per_turn else read

    def _write(self, scope: str, key: str, value: Any, context: ExecutionContext | None,
               idempotency_key: str | None = None,
               replace: bool = False) -> Operation[WriteResult]:
        copied = json_copy(value)
        if not isinstance(replace, bool):
            raise InvalidInput(f"replace must be True or False, got {replace!r}")
        where = self._locate("write", scope, key, context)
        if where is None:
            return WriteResult(False, scope, "", refused=True)
        # a key holds a value or a conversation: writing over a conversation is
        # KeyConflict unless replace is asked (then the fingerprint says so too)
        keywords: dict[str, Any] = idempotency_keyword(self._idempotency(
            idempotency_key, "write", where, {"replace": copied} if replace else copied))
        if replace:
            keywords["replace"] = True
        expiry = self._expiry(where.scope)
        if expiry is not None:
            keywords["expiry"] = expiry
        replayed = (yield StoreCall("write", (where, copied), keywords)) is True
        self._count_replay(replayed)
        return WriteResult(True, scope, where.scope_id, replayed=replayed)

    def _delete(self, scope: str, key: str, context: ExecutionContext | None,
                idempotency_key: str | None = None) -> Operation[DeleteResult]:
        where = self._locate("delete", scope, key, context)
        if where is None:
            return DeleteResult(False, False, scope, "", refused=True)
        idempotency = self._idempotency(idempotency_key, "delete", where, None)
        outcome: DeleteOutcome = yield StoreCall("delete", (where,),
                                                 idempotency_keyword(idempotency))
        self._count_replay(outcome.replayed)
        return DeleteResult(True, outcome.found, scope, where.scope_id,
                            replayed=outcome.replayed)

    def _count_replay(self, replayed: bool) -> None:
        """A replayed write or delete, for ``idempotent_replays`` (an append counts its own)."""
        if replayed and self.metrics is not None:
            self.metrics.replayed(self.backend)

    # An append is not an Operation: each face calls its store directly between these
    # two halves (its one append path; metrics, when kept, time that call).
    def _append_call(self, scope: str, key: str, incoming: Message | Sequence[Message],
                     context: ExecutionContext | None, max_messages: int | None,
                     idempotency_key: str | None, format: str, tail: int | None = None,
                     ) -> PreparedAppend | ScopedAppendResult:
        """Validate and locate an append: the store call's arguments, or the refused result."""
        canonical = (canonical_messages(incoming) if format == "canonical"
                     else to_canonical(incoming, format))
        if self._per_turn:
            refuse_aliases(canonical)
            canonical = PerTurn(canonical)
        window = None if max_messages is None else check_max_messages(max_messages)
        if tail is not None:
            check_cursor("tail", tail, low=1)
        where = self._locate("append", scope, key, context)
        if where is None:
            return ScopedAppendResult(
                scope=scope, resolved_scope_id="", refused=True, count=0, appended=0,
                messages=[], tail=None if tail is None else HistoryResult(scope=scope,
                                                                          refused=True, total=0))
        idempotency = (None if idempotency_key is None else
                       self._idempotency(idempotency_key, "append", where,
                                         [canonical, window, "per_turn"] if self._per_turn
                                         else [canonical, window]))
        return where, canonical, window, idempotency, self._expiry(where.scope)

    def _append_result(self, where: StorageKey, outcome: AppendOutcome) -> ScopedAppendResult:
        """The result of an append the store answered with ``outcome`` (MEM-12 warning)."""
        if self.metrics is not None:
            self.metrics.appended(self.backend, outcome)
        if not outcome.serialized:
            logger.warning("flowmem: lock of %r not had within %.3fs; append ran unserialized "
                           "(MEM-12)", where, self.lock_timeout)
        loaders = self._loaders
        if loaders[0] is not where:  # the same key as the last append: the same loader
            loaders = self._loaders = (where, *(callers_loaders(*self._loader(where))
                                                if self._per_turn else self._loader(where)))
        _, load, aload = loaders
        page = outcome.tail
        return appended_result(where.scope, where.scope_id, outcome.serialized, outcome.count,
                               outcome.appended, outcome.replayed, load, aload,
                               None if page is None else self._callers(
                                   HistoryResult.of_page(page, where.scope, where.scope_id)),
                               outcome.stats)

    def _callers(self, result: HistoryResult) -> HistoryResult:
        """``result`` with the caller's call ids (a per-turn memory's aliases given back)."""
        return callers_history(result) if self._per_turn else result

    def _loader(self, where: StorageKey) -> tuple[Loader | None, AsyncLoader | None]:
        """How an append result reads its buffer on this face: ``(load, aload)``."""
        raise NotImplementedError

    def _history(self, scope: str, key: str, context: ExecutionContext | None,
                 last: int | None, before: int | None) -> Operation[HistoryResult]:
        check_cursor("last", last, low=0)
        check_cursor("before", before, low=-(2 ** 63))
        where = self._locate("history", scope, key, context)
        if where is None:
            return HistoryResult(scope=scope, refused=True, total=0)
        page = yield StoreCall("history", (where,), {"last": last, "before": before})
        if page.positions:
            yield from self._refreshed(where)
        return self._callers(HistoryResult.of_page(page, scope, where.scope_id))

    def _keys(self, scope: str, context: ExecutionContext | None, prefix: str,
              after: str | None, limit: int) -> Operation[list[str]]:
        if not isinstance(prefix, str) or (after is not None and not isinstance(after, str)):
            raise InvalidInput("prefix and after must be strings")
        checked = check_limit(limit)
        scope_id = self._scope_id("keys", scope, context, prefix)
        if scope_id is None:
            return []
        keys: list[str] = yield StoreCall("keys", (scope, scope_id),
                                          {"prefix": prefix, "after": after, "limit": checked})
        return keys

    def _edit(self, scope: str, key: str, position: int, message: Message | None,
              context: ExecutionContext | None) -> Operation[bool]:
        check_cursor("position", position, low=-(2 ** 63))
        if position is None:
            raise InvalidInput("position must be an integer")
        replacement = None if message is None else canonical_message(message)
        where = self._locate("edit", scope, key, context)
        if where is None:
            return False
        if self._per_turn and replacement is not None and position < 2 ** 63 - 1:
            refuse_aliases([replacement])  # the caller's ids: given the entry's stored ids
            page = yield StoreCall("history", (where,), {"last": 1, "before": position + 1})
            if page.positions and page.positions[-1] == position:
                replacement = stored_edit(page.messages[-1], replacement)
        existed: bool = yield StoreCall("edit", (where, position, replacement))
        return existed

    def _pop(self, scope: str, key: str,
             context: ExecutionContext | None) -> Operation[Message | None]:
        where = self._locate("pop", scope, key, context)
        if where is None:
            return None
        page = yield StoreCall("history", (where,), {"last": 1})
        if not page.messages:
            return None
        removed: bool = yield StoreCall("edit", (where, page.positions[0], None))
        if not removed:
            return None
        return caller_messages(page.messages[:1])[0] if self._per_turn else page.messages[0]
