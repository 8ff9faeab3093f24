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

import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from .coordinator import (
    DEFAULT_IDEMPOTENCY_TTL,
    DEFAULT_LOCK_TIMEOUT,
    AsyncLoader,
    MemoryCore,
    Operation,
    T,
)
from .messages import Message
from .metrics import Metrics, backend_name
from .results import DeleteResult, HistoryResult, ReadResult, ScopedAppendResult, WriteResult
from .scopes import ExecutionContext, StorageKey
from .store import AsyncStore

__all__ = ["AsyncMemory"]


class AsyncMemory(MemoryCore):
    """Conversation memory over one :class:`~flowmem.store.AsyncStore` (see :class:`Memory`)."""

    def __init__(self, store: AsyncStore, *, lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
                 idempotency_ttl: float = DEFAULT_IDEMPOTENCY_TTL,
                 metrics: Metrics | None = None) -> None:
        super().__init__(lock_timeout=lock_timeout, idempotency_ttl=idempotency_ttl,
                         metrics=metrics, backend=backend_name(store))
        self.store = store

    @classmethod
    def from_url(cls, url: str | None = None, *, lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
                 idempotency_ttl: float = DEFAULT_IDEMPOTENCY_TTL,
                 metrics: Metrics | None = None) -> AsyncMemory:
        """Open the store a URL names, as :meth:`Memory.from_url` (no running loop needed)."""
        from .stores import open_async_store

        return cls(open_async_store(url), lock_timeout=lock_timeout,
                   idempotency_ttl=idempotency_ttl, metrics=metrics)

    async def _run(self, operation: Operation[T]) -> T:
        metrics = self.metrics
        try:
            call = next(operation)
            while True:
                method = getattr(self.store, call.method)
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
                    idempotency_key: str | None = None) -> WriteResult:
        """As :meth:`Memory.write`."""
        return await self._run(self._write(scope, key, value, context, idempotency_key))

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
        if self.metrics is not None:  # the generator protocol times the store call
            return await self._run(self._append(scope, key, incoming, context, max_messages,
                                                idempotency_key, format, tail))
        prepared = self._append_call(scope, key, incoming, context, max_messages,
                                     idempotency_key, format, tail)
        if isinstance(prepared, ScopedAppendResult):
            return prepared  # refused (MEM-7): no store call
        where, canonical, window, idempotency = prepared
        if tail:  # passed only when asked: a store older than the option keeps working
            outcome = await self.store.append(where, canonical, max_messages=window,
                                        lock_timeout=self.lock_timeout,
                                        idempotency=idempotency, tail=tail)
        else:
            outcome = await self.store.append(where, canonical, max_messages=window,
                                        lock_timeout=self.lock_timeout,
                                        idempotency=idempotency)
        return self._append_result(where, outcome)

    async def history(self, scope: str, key: str, *, context: ExecutionContext | None,
                      last: int | None = None, before: int | None = None) -> HistoryResult:
        """As :meth:`Memory.history`."""
        return await self._run(self._history(scope, key, context, last, before))

    async def edit(self, scope: str, key: str, position: int, message: Message | None, *,
                   context: ExecutionContext | None) -> bool:
        """As :meth:`Memory.edit` (the administrative tier, MEM-15)."""
        return await self._run(self._edit(scope, key, position, message, context))

    async def pop(self, scope: str, key: str, *,
                  context: ExecutionContext | None) -> Message | None:
        """As :meth:`Memory.pop`."""
        return await self._run(self._pop(scope, key, context))

    # -- lifecycle ------------------------------------------------------------
    async def aclose(self) -> None:
        """Close the store."""
        await self.store.aclose()

    async def __aenter__(self) -> AsyncMemory:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()
