"""The coordinator's blocking face: every memory read, write, delete and append.

:class:`Memory` stands between a runtime (or the CLI) and a
:class:`~flowmem.store.Store`. Its logic — validation, the ONE place a
scope refusal is acted on (MEM-7), the MEM-12 fallback warning — lives in
:mod:`flowmem.coordinator`, shared with :class:`~flowmem.AsyncMemory`; this
face only runs the store calls. Under a refused scope no backend method is
called: every operation returns its neutral result with ``refused=True``
and ``resolved_scope_id == ""``, and exactly one warning is logged on the
``flowmem`` logger naming the node, pipeline and workflow.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from .coordinator import (
    DEFAULT_IDEMPOTENCY_TTL,
    DEFAULT_LOCK_TIMEOUT,
    MAX_KEY_LENGTH,
    Loader,
    MemoryCore,
    Operation,
    T,
)
from .messages import Message
from .metrics import Metrics, backend_name
from .results import DeleteResult, HistoryResult, ReadResult, ScopedAppendResult, WriteResult
from .scopes import ExecutionContext, StorageKey
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


class Memory(MemoryCore):
    """Conversation memory over one store (blocking; see :class:`~flowmem.AsyncMemory`).

    ``lock_timeout`` bounds the MEM-12 wait for a conversation's lock (past
    it the append goes ahead unserialized, logs one warning, and is still
    made whole by the backend's own atomicity).
    """

    def __init__(self, store: Store, *, lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
                 idempotency_ttl: float = DEFAULT_IDEMPOTENCY_TTL,
                 metrics: Metrics | None = None) -> None:
        super().__init__(lock_timeout=lock_timeout, idempotency_ttl=idempotency_ttl,
                         metrics=metrics, backend=backend_name(store))
        self.store = store

    @classmethod
    def from_url(cls, url: str | None = None, *, lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
                 idempotency_ttl: float = DEFAULT_IDEMPOTENCY_TTL,
                 metrics: Metrics | None = None) -> Memory:
        """Open the store a URL names (``None``: ``$FLOWMEM_STORE`` or ``sqlite:///flowmem.db``)."""
        from .stores import open_store

        return cls(open_store(url), lock_timeout=lock_timeout, idempotency_ttl=idempotency_ttl,
                   metrics=metrics)

    def _run(self, operation: Operation[T]) -> T:
        metrics = self.metrics
        try:
            call = next(operation)
            while True:
                method = getattr(self.store, call.method)
                if metrics is None:
                    call = operation.send(method(*call.args, **call.kwargs))
                    continue
                start = time.perf_counter()
                try:
                    answer = method(*call.args, **call.kwargs)
                except BaseException as exc:
                    metrics.failed(self.backend, call.method, exc)
                    raise
                metrics.called(self.backend, call.method, time.perf_counter() - start)
                call = operation.send(answer)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def _loader(self, where: StorageKey) -> tuple[Loader, None]:
        store = self.store
        return lambda: store.history(where).messages, None

    # -- values ---------------------------------------------------------------
    def read(self, scope: str, key: str, *, context: ExecutionContext | None,
             default: Any = None) -> ReadResult:
        """Read a value; a conversation reads as its message list."""
        return self._run(self._read(scope, key, context, default))

    def write(self, scope: str, key: str, value: Any, *,
              context: ExecutionContext | None,
              idempotency_key: str | None = None) -> WriteResult:
        """Write a JSON value (anything else raises :class:`~flowmem.InvalidValue`).

        ``idempotency_key``: a retry with the same key changes nothing (see :meth:`append`).
        """
        return self._run(self._write(scope, key, value, context, idempotency_key))

    def delete(self, scope: str, key: str, *, context: ExecutionContext | None,
               idempotency_key: str | None = None) -> DeleteResult:
        """Delete a value or a conversation; a missing key is ``ok`` and not ``found``.

        ``idempotency_key``: a retry with the same key returns the first ``found``.
        """
        return self._run(self._delete(scope, key, context, idempotency_key))

    def keys(self, scope: str, *, context: ExecutionContext | None, prefix: str = "",
             after: str | None = None, limit: int = 100) -> list[str]:
        """Keys (values and conversations) of a scope, sorted by code point, paged by ``after``.

        A refused scope lists nothing (MEM-7).
        """
        return self._run(self._keys(scope, context, prefix, after, limit))

    # -- conversations --------------------------------------------------------
    def append(self, scope: str, key: str, incoming: Message | Sequence[Message], *,
               context: ExecutionContext | None,
               max_messages: int | None = None,
               idempotency_key: str | None = None,
               format: str = "canonical",
               tail: int | None = None) -> ScopedAppendResult:
        """Append to the conversation at (scope, key) with the full MEM-1..14 rules.

        ``messages`` on the result is read from the store when first accessed.
        ``format`` names the dialect of ``incoming``: ``canonical`` (flowmem's
        shape or flat OpenAI Chat), ``openai``, ``responses`` or ``anthropic``
        (see :mod:`flowmem.formats`); the rules then apply by call id whatever
        the dialect (MEM-11).

        ``idempotency_key`` makes a retry safe: the key is recorded in the same
        transaction as the append; a repeat with the same key and the same
        input returns the first outcome (``replayed=True``) and changes nothing;
        the same key with another input raises
        :class:`~flowmem.errors.IdempotencyConflict`. Keys are remembered at
        least ``idempotency_ttl`` seconds (24 h by default) on every backend.

        ``tail=N`` also reads the newest ``N`` entries as the append left
        them, in the append's own transaction (``result.tail``, a
        :class:`~flowmem.HistoryResult`): what ``history(last=N)`` would give
        at that instant, with no other writer between and no second round
        trip. A replayed append's tail is the conversation as it is now.
        """
        if self.metrics is not None:  # the generator protocol times the store call
            return self._run(self._append(scope, key, incoming, context, max_messages,
                                          idempotency_key, format, tail))
        prepared = self._append_call(scope, key, incoming, context, max_messages,
                                     idempotency_key, format, tail)
        if isinstance(prepared, ScopedAppendResult):
            return prepared  # refused (MEM-7): no store call
        where, canonical, window, idempotency = prepared
        if tail:  # passed only when asked: a store older than the option keeps working
            outcome = self.store.append(where, canonical, max_messages=window,
                                        lock_timeout=self.lock_timeout,
                                        idempotency=idempotency, tail=tail)
        else:
            outcome = self.store.append(where, canonical, max_messages=window,
                                        lock_timeout=self.lock_timeout,
                                        idempotency=idempotency)
        return self._append_result(where, outcome)

    def history(self, scope: str, key: str, *, context: ExecutionContext | None,
                last: int | None = None, before: int | None = None) -> HistoryResult:
        """A page of the conversation, without loading the whole of it."""
        return self._run(self._history(scope, key, context, last, before))

    def edit(self, scope: str, key: str, position: int, message: Message | None, *,
             context: ExecutionContext | None) -> bool:
        """Replace (``None``: delete) the entry at ``position``: the administrative tier.

        MEM-15: a stored message is changed only by an administrator; deciding
        who is one is the caller's (the HTTP service asks :mod:`flowmem.access`).
        The buffer's indexes are derived again, so an edit never leaves a
        result twice or a call unhealable. Returns whether the entry existed.
        """
        return self._run(self._edit(scope, key, position, message, context))

    def pop(self, scope: str, key: str, *, context: ExecutionContext | None) -> Message | None:
        """Remove and return the newest entry of a conversation (``None`` when empty).

        For runtimes whose own session API needs it (the OpenAI Agents SDK's
        ``pop_item``). It is an edit of a stored message, so it belongs to the
        administrative tier of MEM-15: the HTTP service never exposes it below
        admin; a runtime owning its memory may use it. Removing a turn that
        declared calls removes the calls' indexes with it, so the buffer stays
        consistent (a later result for such a call is stored as a plain result).
        """
        return self._run(self._pop(scope, key, context))

    # -- lifecycle ------------------------------------------------------------
    def close(self) -> None:
        """Close the store."""
        self.store.close()

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
