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
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from .call_ids import CallIds
from .context import CompactResult, TokenCounter
from .context._operations import budgeted, compaction
from .context._read import compaction_write
from .coordinator import (
    DEFAULT_IDEMPOTENCY_TTL,
    DEFAULT_LOCK_TIMEOUT,
    MAX_KEY_LENGTH,
    MemoryCore,
    Operation,
    T,
    extras,
)
from .erasure import ErasureReceipt, erase_user
from .errors import InvalidInput
from .messages import Message
from .metrics import Metrics, backend_name
from .results import (
    DeleteResult,
    HistoryResult,
    Loader,
    ReadResult,
    ScopedAppendResult,
    WriteResult,
)
from .retention import Retention, Swept, check_retention
from .scopes import ExecutionContext, StorageKey
from .store import Store

_ANY = Retention()  # sweep() needs a store that keeps expiry, with or without a policy

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
    made whole by the backend's own atomicity). ``call_ids``: the call-id
    policy, ``"strict"`` (MEM-2 as the spec states it: a turn whose every id is
    already declared is dropped and counted in ``dropped_turns``) or
    ``"per_turn"`` (for models that reuse call ids: :mod:`flowmem.call_ids`).
    """

    def __init__(self, store: Store, *, lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
                 idempotency_ttl: float = DEFAULT_IDEMPOTENCY_TTL,
                 metrics: Metrics | None = None, retention: Any = None,
                 call_ids: CallIds = "strict",
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(lock_timeout=lock_timeout, idempotency_ttl=idempotency_ttl,
                         metrics=metrics, backend=backend_name(store), retention=retention,
                         clock=clock, call_ids=call_ids)
        check_retention(store, self.retention)
        self.store = store

    @classmethod
    def from_url(cls, url: str | None = None, *, lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
                 idempotency_ttl: float = DEFAULT_IDEMPOTENCY_TTL,
                 metrics: Metrics | None = None, retention: Any = None,
                 clock: Callable[[], float] = time.time,
                 call_ids: CallIds = "strict") -> Memory:
        """Open the store a URL names (``None``: ``$FLOWMEM_STORE`` or ``sqlite:///flowmem.db``)."""
        from .stores import open_store

        return cls(open_store(url), lock_timeout=lock_timeout, idempotency_ttl=idempotency_ttl,
                   metrics=metrics, retention=retention, clock=clock, call_ids=call_ids)

    def _run(self, operation: Operation[T]) -> T:
        metrics = self.metrics
        try:
            call = next(operation)
            while True:
                method = getattr(self.store, call.method)
                if self.retention is not None:
                    self._dated(call)
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
              idempotency_key: str | None = None, replace: bool = False) -> WriteResult:
        """Write a JSON value (anything else raises :class:`~flowmem.InvalidValue`).

        A key holds a value or a conversation: writing a value over a conversation
        raises :class:`~flowmem.KeyConflict` and changes nothing, unless
        ``replace=True`` (the conversation is dropped and the value takes its place,
        in one atomic step). ``idempotency_key``: a retry with the same key changes
        nothing (see :meth:`append`).
        """
        return self._run(self._write(scope, key, value, context, idempotency_key, replace))

    def delete(self, scope: str, key: str, *, context: ExecutionContext | None,
               idempotency_key: str | None = None) -> DeleteResult:
        """Delete a value or a conversation; a missing key is ``ok`` and not ``found``.

        ``idempotency_key``: a retry with the same key changes nothing and returns the
        first ``found`` with ``replayed=True``, whatever the key holds by then.
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
        :class:`~flowmem.errors.IdempotencyConflict`. A key is scoped to the
        conversation it names (the same key on another conversation is another
        operation), and remembered at least ``idempotency_ttl`` seconds (24 h by
        default) on every backend.

        ``tail=N`` also reads the newest ``N`` entries as the append left
        them, in the append's own transaction (``result.tail``, a
        :class:`~flowmem.HistoryResult`): what ``history(last=N)`` would give
        at that instant, with no other writer between and no second round
        trip. A replayed append's tail is the conversation as it is now.
        """
        prepared = self._append_call(scope, key, incoming, context, max_messages,
                                     idempotency_key, format, tail)
        if isinstance(prepared, ScopedAppendResult):
            return prepared  # refused (MEM-7): no store call
        where, canonical, window, idempotency, expiry = prepared
        metrics = self.metrics
        start = time.perf_counter() if metrics is not None else 0.0
        try:
            if tail or expiry is not None:  # passed only when asked: any store keeps working
                outcome = self.store.append(where, canonical, max_messages=window,
                                            lock_timeout=self.lock_timeout,
                                            idempotency=idempotency, **extras(tail, expiry))
            else:
                outcome = self.store.append(where, canonical, max_messages=window,
                                            lock_timeout=self.lock_timeout,
                                            idempotency=idempotency)
        except BaseException as exc:
            if metrics is not None:
                metrics.failed(self.backend, "append", exc)
            raise
        if metrics is not None:
            metrics.called(self.backend, "append", time.perf_counter() - start)
        return self._append_result(where, outcome)

    def history(self, scope: str, key: str, *, context: ExecutionContext | None,
                last: int | None = None, before: int | None = None,
                max_tokens: int | None = None, counter: TokenCounter | None = None,
                format: str = "canonical", keep_system: bool = True) -> HistoryResult:
        """A page of the conversation, without loading the whole of it.

        ``max_tokens=N``: the newest whole turns whose count is within ``N``
        (``last``/``before`` are not taken with it), repaired to be sendable,
        counted by ``counter`` (default :data:`flowmem.context.approximate`) in
        ``format``, the dialect they will be sent in; ``result.tokens`` and
        ``result.omitted`` say what it holds and left out. Reads only what it
        returns (see ``docs/context.md``).
        """
        if max_tokens is not None:
            if last is not None or before is not None:
                raise InvalidInput("max_tokens reads the newest turns: give it without "
                                   "last or before")
            return self._run(budgeted(self, scope, key, context, max_tokens, counter,
                                      format, keep_system))
        return self._run(self._history(scope, key, context, last, before))

    def compact(self, scope: str, key: str, *, context: ExecutionContext | None,
                summarize: Callable[[list[Message]], str],
                keep_last_tokens: int | None = None, keep_last: int | None = None,
                counter: TokenCounter | None = None, format: str = "canonical",
                idempotency_key: str | None = None, attempts: int = 5) -> CompactResult:
        """Replace everything older than the kept tail by ONE summary (the owner's edit).

        ``summarize(messages) -> str`` is called with the messages replaced (a
        previous summary first, if any). The tail kept is the newest
        ``keep_last`` messages at least, or the longest within
        ``keep_last_tokens`` (counted as :meth:`history` counts), cut on a
        user turn no tool result reaches back across. The summary is written
        by one atomic edit that checks the range is still what was summarized
        (else it reads and summarizes again, ``attempts`` times in all); an
        edit of stored messages, so the HTTP service offers it only at the
        administrative tier (MEM-15). ``idempotency_key``: a repeat finds the
        summary it wrote and returns it (``replayed=True``) without calling
        ``summarize``. See ``docs/context.md``.
        """
        from .context import CompactionConflict

        for attempt in range(max(1, attempts)):
            plan = self._run(compaction(self, scope, key, context, keep_last,
                                        keep_last_tokens, counter, format, idempotency_key))
            if isinstance(plan, CompactResult):
                return plan
            text = summarize(list(plan.messages))
            try:
                done: CompactResult = self._run(
                    compaction_write(plan, text, idempotency_key))
                return done
            except CompactionConflict:
                if attempt + 1 >= max(1, attempts):
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

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

    # -- retention ------------------------------------------------------------
    def sweep(self, *, batch: int = 100, max_batches: int | None = None) -> Swept:
        """Delete expired conversations and values (with their idempotency records),
        ``batch`` at a time, each batch one short transaction of the store: appends to
        live conversations go on between batches. Returns the counts by scope; ``done``
        is ``False`` when ``max_batches`` ran out first. Idempotent: a second sweep at
        the same instant finds nothing. Needs a store that keeps expiry (see
        ``docs/operations.md``, Retention).
        """
        check_retention(self.store, self.retention or _ANY)
        swept = Swept()
        while max_batches is None or max_batches > 0:
            step = self._run(self._sweep(batch))
            swept = swept.plus(step)
            if step.done:
                return swept
            max_batches = None if max_batches is None else max_batches - 1
        return Swept(swept.by_scope, done=False)

    # -- erasure --------------------------------------------------------------
    def erase_user(self, user_id: str, *, dry_run: bool = False) -> ErasureReceipt:
        """Delete every conversation and value of ``user_id``'s ``user`` scope, and the
        idempotency records kept for them; an :class:`~flowmem.erasure.ErasureReceipt`
        (counts, never content) says what went.

        Safe under concurrent appends: one racing the erasure is either erased or
        refused (:class:`~flowmem.errors.ErasureInProgress`, nothing written), never
        left behind. A second erasure finds nothing (zero counts); ``dry_run`` counts
        what would go and deletes nothing. ``workflow``, ``pipeline``, ``execution``
        and ``global`` memories are not per-user: they are left as they are (MEM-6).
        """
        return self._run(erase_user(user_id, dry_run))

    # -- lifecycle ------------------------------------------------------------
    def close(self) -> None:
        """Close the store."""
        self.store.close()

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
