"""The coordinator: every memory read, write, delete and conversation append.

:class:`Memory` stands between a runtime (or the HTTP service, or the CLI)
and a :class:`~flowmem.store.Store`. It validates input, resolves the scope —
the ONE place a refusal is acted on (MEM-7) — and logs the MEM-12 fallback.
Under a refused scope no backend method is called: every operation returns
its neutral result with ``refused=True`` and ``resolved_scope_id == ""``,
and exactly one warning
is logged on the ``flowmem`` logger naming the node, pipeline and workflow.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final

from .buffer import AppendResult, check_max_messages
from .errors import InvalidInput, ScopeRefused
from .ids import is_key_text
from .messages import Message, canonical_messages, json_copy
from .scopes import ExecutionContext, StorageKey, resolve_scope
from .store import Store

__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "MAX_KEY_LENGTH",
    "DeleteResult",
    "HistoryResult",
    "Memory",
    "ReadResult",
    "ScopedAppendResult",
    "WriteResult",
]

logger = logging.getLogger("flowmem")

DEFAULT_LOCK_TIMEOUT: Final = 5.0
MAX_KEY_LENGTH: Final = 512


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
    """A write: whether it took effect, and where."""

    ok: bool
    scope: str
    resolved_scope_id: str
    refused: bool = False


@dataclass(frozen=True, slots=True)
class DeleteResult:
    """A delete: ``ok`` unless refused; ``found`` whether anything was there."""

    ok: bool
    found: bool
    scope: str
    resolved_scope_id: str
    refused: bool = False


@dataclass(frozen=True, slots=True)
class HistoryResult:
    """A page of a conversation, oldest first; ``before`` pages further back."""

    messages: list[Message] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    before: int | None = None
    scope: str = ""
    resolved_scope_id: str = ""
    refused: bool = False


class ScopedAppendResult(AppendResult):
    """The core :class:`~flowmem.AppendResult` plus where it was appended."""

    __slots__ = ("refused", "resolved_scope_id", "scope", "serialized")

    def __init__(self, *, scope: str, resolved_scope_id: str, serialized: bool = True,
                 refused: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scope = scope
        self.resolved_scope_id = resolved_scope_id
        self.serialized = serialized
        self.refused = refused


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


class Memory:
    """Conversation memory over one store.

    ``lock_timeout`` bounds the MEM-12 wait for a conversation's lock (past
    it the append goes ahead unserialized, logs one warning, and is still
    made whole by the backend's own atomicity).
    """

    def __init__(self, store: Store, *, lock_timeout: float = DEFAULT_LOCK_TIMEOUT) -> None:
        self.store = store
        self.lock_timeout = lock_timeout

    @classmethod
    def from_url(cls, url: str | None = None, *,
                 lock_timeout: float = DEFAULT_LOCK_TIMEOUT) -> Memory:
        """Open the store a URL names (``None``: ``$FLOWMEM_STORE`` or ``sqlite:///flowmem.db``)."""
        from .stores import open_store

        return cls(open_store(url), lock_timeout=lock_timeout)

    # -- the one refusal decision (MEM-6, MEM-7, MEM-13) --------------------
    def _locate(self, operation: str, scope: str, key: Any,
                context: ExecutionContext | None) -> StorageKey | None:
        checked = _check_key(key)
        try:
            scope_id = resolve_scope(scope, context)
        except ScopeRefused as refusal:
            logger.warning(
                "flowmem: %s of %r refused (%s); node=%r pipeline=%r workflow=%r",
                operation, checked, refusal.reason,
                getattr(context, "node_id", None), getattr(context, "pipeline_id", None),
                getattr(context, "workflow_id", None),
            )
            return None
        return StorageKey(scope, scope_id, checked)

    # -- values ---------------------------------------------------------------
    def read(self, scope: str, key: str, *, context: ExecutionContext | None,
             default: Any = None) -> ReadResult:
        """Read a value; a conversation reads as its message list."""
        where = self._locate("read", scope, key, context)
        if where is None:
            return ReadResult(default, False, scope, "", refused=True)
        found, value = self.store.read(where)
        return ReadResult(value if found else default, found, scope, where.scope_id)

    def write(self, scope: str, key: str, value: Any, *,
              context: ExecutionContext | None) -> WriteResult:
        """Write a JSON value (anything else raises :class:`~flowmem.InvalidValue`)."""
        copied = json_copy(value)
        where = self._locate("write", scope, key, context)
        if where is None:
            return WriteResult(False, scope, "", refused=True)
        self.store.write(where, copied)
        return WriteResult(True, scope, where.scope_id)

    def delete(self, scope: str, key: str, *, context: ExecutionContext | None) -> DeleteResult:
        """Delete a value or a conversation; a missing key is ``ok`` and not ``found``."""
        where = self._locate("delete", scope, key, context)
        if where is None:
            return DeleteResult(False, False, scope, "", refused=True)
        found = self.store.delete(where)
        return DeleteResult(True, found, scope, where.scope_id)

    # -- conversations --------------------------------------------------------
    def append(self, scope: str, key: str, incoming: Message | Sequence[Message], *,
               context: ExecutionContext | None,
               max_messages: int | None = None) -> ScopedAppendResult:
        """Append to the conversation at (scope, key) with the full MEM-1..14 rules.

        ``messages`` on the result is read from the store when first accessed.
        """
        canonical = canonical_messages(incoming)
        window = check_max_messages(max_messages)
        where = self._locate("append", scope, key, context)
        if where is None:
            return ScopedAppendResult(scope=scope, resolved_scope_id="", refused=True, count=0,
                                      appended=0, messages=[])
        outcome = self.store.append(where, canonical, max_messages=window,
                                    lock_timeout=self.lock_timeout)
        if not outcome.serialized:
            logger.warning("flowmem: lock of %r not had within %.3fs; append ran unserialized "
                           "(MEM-12)", where, self.lock_timeout)
        store = self.store
        return ScopedAppendResult(
            scope=scope, resolved_scope_id=where.scope_id, serialized=outcome.serialized,
            count=outcome.count, appended=outcome.appended,
            load=lambda: store.history(where).messages,
        )

    def history(self, scope: str, key: str, *, context: ExecutionContext | None,
                last: int | None = None, before: int | None = None) -> HistoryResult:
        """A page of the conversation, without loading the whole of it."""
        _check_cursor("last", last, low=0)
        _check_cursor("before", before, low=-(2 ** 63))
        where = self._locate("history", scope, key, context)
        if where is None:
            return HistoryResult(scope=scope, refused=True)
        page = self.store.history(where, last=last, before=before)
        return HistoryResult(page.messages, page.positions, page.before, scope, where.scope_id)

    # -- lifecycle ------------------------------------------------------------
    def close(self) -> None:
        """Close the store."""
        self.store.close()

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
