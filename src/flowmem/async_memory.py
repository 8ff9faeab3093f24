"""The coordinator's asyncio face: :class:`AsyncMemory`.

The same operations, arguments, results, refusals (MEM-7: no backend call,
one warning) and errors as :class:`~flowmem.Memory` — the logic is the one
copy in :mod:`flowmem.coordinator`; this face only awaits the store calls
on an :class:`~flowmem.store.AsyncStore`. Native drivers: psycopg's async
pool for PostgreSQL, ``redis.asyncio`` for Redis, ``memory://`` on the loop,
and SQLite on one connection thread per store, so the loop never blocks on
a file lock, an fsync or a busy wait.

An append's ``result.messages`` is read with ``await result.load_messages()``
(a property cannot await).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any

from .call_ids import CallIds
from .context import CompactResult, TokenCounter
from .context._operations import budgeted, compaction
from .context._read import compaction_write
from .coordinator import (
    DEFAULT_IDEMPOTENCY_TTL,
    DEFAULT_LOCK_TIMEOUT,
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
    AsyncLoader,
    DeleteResult,
    HistoryResult,
    ReadResult,
    ScopedAppendResult,
    WriteResult,
)
from .retention import Retention, Swept, check_retention
from .scopes import ExecutionContext, StorageKey
from .store import AsyncStore

_ANY = Retention()  # sweep() needs a store that keeps expiry, with or without a policy

__all__ = ["AsyncMemory"]


class AsyncMemory(MemoryCore):
    """Conversation memory over one :class:`~flowmem.store.AsyncStore` (see :class:`Memory`)."""

    def __init__(self, store: AsyncStore, *, lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
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
                 call_ids: CallIds = "strict") -> AsyncMemory:
        """Open the store a URL names, as :meth:`Memory.from_url` (no running loop needed)."""
        from .stores import open_async_store

        return cls(open_async_store(url), lock_timeout=lock_timeout,
                   idempotency_ttl=idempotency_ttl, metrics=metrics, retention=retention,
                   clock=clock, call_ids=call_ids)

    async def _run(self, operation: Operation[T]) -> T:
        metrics = self.metrics
        try:
            call = next(operation)
            while True:
                method = getattr(self.store, call.method)
                if self.retention is not None:
                    self._dated(call)
                if metrics is None:
                    call = operation.send(await method(*call.args, **call.kwargs))
                    continue
                start = time.perf_counter()
                try:
                    answer = await method(*call.args, **call.kwargs)
                except BaseException as exc:
                    metrics.failed(self.backend, call.method, exc)
                    raise
                metrics.called(self.backend, call.method, time.perf_counter() - start)
                call = operation.send(answer)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def _loader(self, where: StorageKey) -> tuple[None, AsyncLoader]:
        store = self.store

        async def load() -> list[Message]:
            return (await store.history(where)).messages

        return None, load

    # -- values ---------------------------------------------------------------
    async def read(self, scope: str, key: str, *, context: ExecutionContext | None,
                   default: Any = None) -> ReadResult:
        """As :meth:`Memory.read`."""
        return await self._run(self._read(scope, key, context, default))

    async def write(self, scope: str, key: str, value: Any, *,
                    context: ExecutionContext | None,
                    idempotency_key: str | None = None, replace: bool = False) -> WriteResult:
        """As :meth:`Memory.write`."""
        return await self._run(self._write(scope, key, value, context, idempotency_key,
                                           replace))

    async def delete(self, scope: str, key: str, *, context: ExecutionContext | None,
                     idempotency_key: str | None = None) -> DeleteResult:
        """As :meth:`Memory.delete`."""
        return await self._run(self._delete(scope, key, context, idempotency_key))

    async def keys(self, scope: str, *, context: ExecutionContext | None, prefix: str = "",
                   after: str | None = None, limit: int = 100) -> list[str]:
        """As :meth:`Memory.keys`."""
        return await self._run(self._keys(scope, context, prefix, after, limit))

    # -- conversations --------------------------------------------------------
    async def append(self, scope: str, key: str, incoming: Message | Sequence[Message], *,
                     context: ExecutionContext | None,
                     max_messages: int | None = None,
                     idempotency_key: str | None = None,
                     format: str = "canonical",
                     tail: int | None = None) -> ScopedAppendResult:
        """As :meth:`Memory.append`; ``await result.load_messages()`` reads the buffer."""
        prepared = self._append_call(scope, key, incoming, context, max_messages,
                                     idempotency_key, format, tail)
        if isinstance(prepared, ScopedAppendResult):
            return prepared  # refused (MEM-7): no store call
        where, canonical, window, idempotency, expiry = prepared
        metrics = self.metrics
        start = time.perf_counter() if metrics is not None else 0.0
        try:
            if tail or expiry is not None:  # passed only when asked: any store keeps working
                outcome = await self.store.append(where, canonical, max_messages=window,
                                                  lock_timeout=self.lock_timeout,
                                                  idempotency=idempotency, **extras(tail, expiry))
            else:
                outcome = await self.store.append(where, canonical, max_messages=window,
                                                  lock_timeout=self.lock_timeout,
                                                  idempotency=idempotency)
        except BaseException as exc:
            if metrics is not None:
                metrics.failed(self.backend, "append", exc)
            raise
        if metrics is not None:
            metrics.called(self.backend, "append", time.perf_counter() - start)
        return self._append_result(where, outcome)

    async def history(self, scope: str, key: str, *, context: ExecutionContext | None,
                      last: int | None = None, before: int | None = None,
                      max_tokens: int | None = None, counter: TokenCounter | None = None,
                      format: str = "canonical", keep_system: bool = True) -> HistoryResult:
        """As :meth:`Memory.history` (``max_tokens`` included)."""
        if max_tokens is not None:
            if last is not None or before is not None:
                raise InvalidInput("max_tokens reads the newest turns: give it without "
                                   "last or before")
            return await self._run(budgeted(self, scope, key, context, max_tokens, counter,
                                            format, keep_system))
        return await self._run(self._history(scope, key, context, last, before))

    async def compact(self, scope: str, key: str, *, context: ExecutionContext | None,
                      summarize: Callable[[list[Message]], str | Awaitable[str]],
                      keep_last_tokens: int | None = None, keep_last: int | None = None,
                      counter: TokenCounter | None = None, format: str = "canonical",
                      idempotency_key: str | None = None, attempts: int = 5) -> CompactResult:
        """As :meth:`Memory.compact`; ``summarize`` may be a coroutine function."""
        from .context import CompactionConflict

        for attempt in range(max(1, attempts)):
            plan = await self._run(compaction(self, scope, key, context, keep_last,
                                              keep_last_tokens, counter, format, idempotency_key))
            if isinstance(plan, CompactResult):
                return plan
            text = summarize(list(plan.messages))
            if inspect.isawaitable(text):
                text = await text
            try:
                done: CompactResult = await self._run(
                    compaction_write(plan, text, idempotency_key))
                return done
            except CompactionConflict:
                if attempt + 1 >= max(1, attempts):
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def edit(self, scope: str, key: str, position: int, message: Message | None, *,
                   context: ExecutionContext | None) -> bool:
        """As :meth:`Memory.edit` (the administrative tier, MEM-15)."""
        return await self._run(self._edit(scope, key, position, message, context))

    async def pop(self, scope: str, key: str, *,
                  context: ExecutionContext | None) -> Message | None:
        """As :meth:`Memory.pop`."""
        return await self._run(self._pop(scope, key, context))

    # -- retention ------------------------------------------------------------
    async def sweep(self, *, batch: int = 100, max_batches: int | None = None) -> Swept:
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
            step = await self._run(self._sweep(batch))
            swept = swept.plus(step)
            if step.done:
                return swept
            max_batches = None if max_batches is None else max_batches - 1
        return Swept(swept.by_scope, done=False)

    # -- erasure --------------------------------------------------------------
    async def erase_user(self, user_id: str, *, dry_run: bool = False) -> ErasureReceipt:
        """As :meth:`flowmem.Memory.erase_user`."""
        return await self._run(erase_user(user_id, dry_run))

    # -- lifecycle ------------------------------------------------------------
    async def aclose(self) -> None:
        """Close the store."""
        await self.store.aclose()

    async def __aenter__(self) -> AsyncMemory:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()
