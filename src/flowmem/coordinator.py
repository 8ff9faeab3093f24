"""The coordinator's logic, once for both faces (sans-I/O, as httpx and h11 do it).

Each operation of :class:`~flowmem.Memory` and :class:`~flowmem.AsyncMemory`
is written here ONCE as a generator: it validates the input, resolves the
scope — the ONE place a refusal is acted on (MEM-7) — yields the
:class:`StoreCall` it needs and builds the result from the answer. The blocking
face runs the call on a :class:`~flowmem.store.Store`, the asyncio face
awaits it on an :class:`~flowmem.store.AsyncStore`; that is all they differ
in. Under a refused scope the operation returns its neutral result without
yielding at all, so no backend is ever called, and logs exactly one warning
on the ``flowmem`` logger naming the node, pipeline and workflow.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Any, Final, TypeVar

from .buffer import check_max_messages
from .errors import InvalidInput, ScopeRefused
from .formats import to_canonical
from .ids import is_key_text
from .messages import Message, canonical_message, canonical_messages, json_copy
from .metrics import Metrics
from .results import (
    DeleteResult,
    HistoryResult,
    ReadResult,
    ScopedAppendResult,
    WriteResult,
    appended_result,
)
from .scopes import ExecutionContext, StorageKey, resolve_scope
from .store import AppendOutcome, Idempotency

__all__ = [
    "DEFAULT_IDEMPOTENCY_TTL",
    "DEFAULT_LOCK_TIMEOUT",
    "MAX_KEY_LENGTH",
    "MemoryCore",
    "Operation",
    "StoreCall",
]

logger = logging.getLogger("flowmem")

DEFAULT_LOCK_TIMEOUT: Final = 5.0
DEFAULT_IDEMPOTENCY_TTL: Final = 24 * 3600.0
MAX_KEY_LENGTH: Final = 512
MAX_IDEMPOTENCY_KEY_LENGTH: Final = 255
MAX_KEYS_PAGE: Final = 1000

T = TypeVar("T")


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


Operation = Generator[StoreCall, Any, T]
"""A coordinator operation: yields store calls, receives their answers, returns the result."""

PreparedAppend = tuple[StorageKey, list[Message], int | None, Idempotency | None]
"""A located, validated append: where, the canonical messages, the window, the key."""
"""An append's store call: where, the canonical messages, the window, the idempotency."""
Loader = Callable[[], list[Message]]
AsyncLoader = Callable[[], Awaitable[list[Message]]]


_NO_CONTEXT: Final = object()


def _check_key(key: Any) -> str:
    """A key is text every backend can index: 1..MAX_KEY_LENGTH chars, no NUL/surrogate."""
    if (not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH
            or not is_key_text(key)):
        raise InvalidInput(f"key must be a non-empty string of at most {MAX_KEY_LENGTH} "
                           f"characters without NUL or lone surrogates, got {key!r}")
    return key


def _check_cursor(name: str, value: Any, *, low: int) -> None:
    """``last``/``before``: None or an int that every backend can index (64-bit)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < 2 ** 63:
        raise InvalidInput(f"{name} must be None or an integer in [{low}, 2**63), got {value!r}")


def _fingerprint(operation: str, where: StorageKey, payload: Any) -> str:
    """What a retry must repeat exactly: the operation, where, and its canonical input."""
    text = json.dumps([operation, where.scope, where.scope_id, where.key, payload],
                      ensure_ascii=True, separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _keyword(idempotency: Idempotency | None) -> dict[str, Idempotency]:
    """The ``idempotency`` keyword of a store call (none without a key)."""
    return {} if idempotency is None else {"idempotency": idempotency}


def _check_limit(limit: Any) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_KEYS_PAGE:
        raise InvalidInput(f"limit must be an integer in [1, {MAX_KEYS_PAGE}], got {limit!r}")
    return limit


class MemoryCore:
    """Validation, the refusal decision and the result builders of both faces.

    ``lock_timeout`` bounds the MEM-12 wait for a conversation's lock (past
    it the append goes ahead unserialized, logs one warning, and is still
    made whole by the backend's own atomicity). ``idempotency_ttl`` is how
    long, at least, an idempotency key is remembered (seconds; 24 h).
    """

    def __init__(self, *, lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
                 idempotency_ttl: float = DEFAULT_IDEMPOTENCY_TTL,
                 metrics: Metrics | None = None, backend: str = "") -> None:
        self.lock_timeout = lock_timeout
        self.idempotency_ttl = idempotency_ttl
        self.metrics = metrics
        self.backend = backend
        # the last successful resolution (scope, key, context, where); see _locate
        self._last_where: tuple[str, str, object, StorageKey | None] = ("", "", _NO_CONTEXT, None)
        self._loaders: tuple[StorageKey | None, Loader | None, AsyncLoader | None] = (
            None, None, None)

    def _idempotency(self, idempotency_key: str | None, operation: str, where: StorageKey,
                     payload: Any) -> Idempotency | None:
        """The store's ``idempotency`` argument for a key (``None`` without one)."""
        if idempotency_key is None:
            return None
        if (not isinstance(idempotency_key, str) or not idempotency_key
                or len(idempotency_key) > MAX_IDEMPOTENCY_KEY_LENGTH
                or not is_key_text(idempotency_key)):
            raise InvalidInput(f"idempotency_key must be a non-empty string of at most "
                               f"{MAX_IDEMPOTENCY_KEY_LENGTH} characters, got "
                               f"{idempotency_key!r}")
        return Idempotency(idempotency_key, _fingerprint(operation, where, payload),
                           self.idempotency_ttl, time.time())

    # -- the one refusal decision (MEM-6, MEM-7, MEM-13) --------------------
    def _locate(self, operation: str, scope: str, key: Any,
                context: ExecutionContext | None) -> StorageKey | None:
        last = self._last_where
        if last[2] is context and last[0] is scope and last[1] == key and type(key) is str:
            return last[3]  # the same key under the same (frozen) context: resolved before
        checked = _check_key(key)
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
            logger.warning(
                "flowmem: %s of %r refused (%s); node=%r pipeline=%r workflow=%r",
                operation, what, refusal.reason,
                getattr(context, "node_id", None), getattr(context, "pipeline_id", None),
                getattr(context, "workflow_id", None),
            )
            return None

    # -- operations -------------------------------------------------------------
    def _read(self, scope: str, key: str, context: ExecutionContext | None,
              default: Any) -> Operation[ReadResult]:
        where = self._locate("read", scope, key, context)
        if where is None:
            return ReadResult(default, False, scope, "", refused=True)
        found, value = yield StoreCall("read", (where,))
        return ReadResult(value if found else default, found, scope, where.scope_id)

    def _write(self, scope: str, key: str, value: Any, context: ExecutionContext | None,
               idempotency_key: str | None = None) -> Operation[WriteResult]:
        copied = json_copy(value)
        where = self._locate("write", scope, key, context)
        if where is None:
            return WriteResult(False, scope, "", refused=True)
        yield StoreCall("write", (where, copied),
                        _keyword(self._idempotency(idempotency_key, "write", where, copied)))
        return WriteResult(True, scope, where.scope_id)

    def _delete(self, scope: str, key: str, context: ExecutionContext | None,
                idempotency_key: str | None = None) -> Operation[DeleteResult]:
        where = self._locate("delete", scope, key, context)
        if where is None:
            return DeleteResult(False, False, scope, "", refused=True)
        found = yield StoreCall("delete", (where,),
                                _keyword(self._idempotency(idempotency_key, "delete", where,
                                                           None)))
        return DeleteResult(True, found, scope, where.scope_id)

    def _append(self, scope: str, key: str, incoming: Message | Sequence[Message],
                context: ExecutionContext | None, max_messages: int | None,
                idempotency_key: str | None = None, format: str = "canonical",
                tail: int | None = None) -> Operation[ScopedAppendResult]:
        prepared = self._append_call(scope, key, incoming, context, max_messages,
                                     idempotency_key, format, tail)
        if isinstance(prepared, ScopedAppendResult):
            return prepared  # refused (MEM-7): no store call
        where, canonical, window, idempotency = prepared
        options: dict[str, Any] = {"max_messages": window, "lock_timeout": self.lock_timeout}
        if idempotency is not None:
            options["idempotency"] = idempotency
        if tail:
            options["tail"] = tail
        outcome = yield StoreCall("append", (where, canonical), options)
        return self._append_result(where, outcome)

    # The two halves of :meth:`_append`, for a face that calls the store directly
    # (no metrics: nothing to time) and so spares the generator protocol per append.
    def _append_call(self, scope: str, key: str, incoming: Message | Sequence[Message],
                     context: ExecutionContext | None, max_messages: int | None,
                     idempotency_key: str | None, format: str, tail: int | None = None,
                     ) -> PreparedAppend | ScopedAppendResult:
        """Validate and locate an append: the store call's arguments, or the refused result."""
        canonical = (canonical_messages(incoming) if format == "canonical"
                     else to_canonical(incoming, format))
        window = None if max_messages is None else check_max_messages(max_messages)
        if tail is not None:
            _check_cursor("tail", tail, low=1)
        where = self._locate("append", scope, key, context)
        if where is None:
            return ScopedAppendResult(
                scope=scope, resolved_scope_id="", refused=True, count=0, appended=0,
                messages=[], tail=None if tail is None else HistoryResult(scope=scope,
                                                                          refused=True, total=0))
        idempotency = (None if idempotency_key is None else
                       self._idempotency(idempotency_key, "append", where, [canonical, window]))
        return where, canonical, window, idempotency

    def _append_result(self, where: StorageKey, outcome: AppendOutcome) -> ScopedAppendResult:
        """The result of an append the store answered with ``outcome`` (MEM-12 warning)."""
        if self.metrics is not None:
            self.metrics.appended(self.backend, outcome)
        if not outcome.serialized:
            logger.warning("flowmem: lock of %r not had within %.3fs; append ran unserialized "
                           "(MEM-12)", where, self.lock_timeout)
        loaders = self._loaders
        if loaders[0] is not where:  # the same key as the last append: the same loader
            loaders = self._loaders = (where, *self._loader(where))
        _, load, aload = loaders
        page = outcome.tail
        return appended_result(where.scope, where.scope_id, outcome.serialized, outcome.count,
                               outcome.appended, outcome.replayed, load, aload,
                               None if page is None else
                               HistoryResult.of_page(page, where.scope, where.scope_id))

    def _loader(self, where: StorageKey) -> tuple[Loader | None, AsyncLoader | None]:
        """How an append result reads its buffer on this face: ``(load, aload)``."""
        raise NotImplementedError

    def _history(self, scope: str, key: str, context: ExecutionContext | None,
                 last: int | None, before: int | None) -> Operation[HistoryResult]:
        _check_cursor("last", last, low=0)
        _check_cursor("before", before, low=-(2 ** 63))
        where = self._locate("history", scope, key, context)
        if where is None:
            return HistoryResult(scope=scope, refused=True, total=0)
        page = yield StoreCall("history", (where,), {"last": last, "before": before})
        return HistoryResult.of_page(page, scope, where.scope_id)

    def _keys(self, scope: str, context: ExecutionContext | None, prefix: str,
              after: str | None, limit: int) -> Operation[list[str]]:
        if not isinstance(prefix, str) or (after is not None and not isinstance(after, str)):
            raise InvalidInput("prefix and after must be strings")
        checked = _check_limit(limit)
        scope_id = self._scope_id("keys", scope, context, prefix)
        if scope_id is None:
            return []
        keys: list[str] = yield StoreCall("keys", (scope, scope_id),
                                          {"prefix": prefix, "after": after, "limit": checked})
        return keys

    def _edit(self, scope: str, key: str, position: int, message: Message | None,
              context: ExecutionContext | None) -> Operation[bool]:
        _check_cursor("position", position, low=-(2 ** 63))
        if position is None:
            raise InvalidInput("position must be an integer")
        replacement = None if message is None else canonical_message(message)
        where = self._locate("edit", scope, key, context)
        if where is None:
            return False
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
        return page.messages[0] if removed else None
