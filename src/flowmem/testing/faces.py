"""Run an :class:`~flowmem.store.AsyncStore` where a blocking :class:`~flowmem.store.Store`
is expected, so ONE conformance suite checks both faces of a backend.

:class:`BlockingStore` owns an event loop on a thread of its own and runs
each call of the async store there, waiting for the answer: the async
store's own code (its driver, its MEM-12 wait, its locks) does the work::

    class TestMyAsyncStore(StoreContract):
        @pytest.fixture
        def store(self):
            s = BlockingStore(MyAsyncStore(...))
            yield s
            s.close()
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, TypeVar

from ..messages import Message
from ..retention import Expiry
from ..scopes import StorageKey
from ..store import AppendOutcome, AsyncStore, DeleteOutcome, Erased, HistoryPage, Idempotency

__all__ = ["BlockingStore", "LoopThread"]

_T = TypeVar("_T")


class LoopThread:
    """An event loop running on a daemon thread; :meth:`run` waits for a coroutine on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                        name="flowmem-loop")
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coroutine`` on the loop and return its result (or raise its error)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def stop(self) -> None:
        """Stop the loop and join its thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class _HeldLock:
    def __init__(self, loop: LoopThread, context: AbstractAsyncContextManager[bool]) -> None:
        self._loop = loop
        self._context = context

    def __enter__(self) -> bool:
        return self._loop.run(self._context.__aenter__())

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._loop.run(self._context.__aexit__(exc_type, exc, tb))


class BlockingStore:
    """A blocking :class:`~flowmem.store.Store` over an :class:`~flowmem.store.AsyncStore`."""

    def __init__(self, store: AsyncStore) -> None:
        self.async_store = store
        self._loop = LoopThread()

    def read(self, key: StorageKey, **now: float) -> tuple[bool, Any]:
        return self._loop.run(self.async_store.read(key, **now))

    def write(self, key: StorageKey, value: Any, *,
              idempotency: Idempotency | None = None, replace: bool = False,
              **expiry: Expiry) -> bool | None:
        return self._loop.run(self.async_store.write(key, value, idempotency=idempotency,
                                                     replace=replace, **expiry))

    def delete(self, key: StorageKey, *,
               idempotency: Idempotency | None = None) -> DeleteOutcome:
        return self._loop.run(self.async_store.delete(key, idempotency=idempotency))

    def append(self, key: StorageKey, incoming: Sequence[Message], *,
               max_messages: int | None, lock_timeout: float,
               idempotency: Idempotency | None = None, tail: int = 0,
               **expiry: Expiry) -> AppendOutcome:
        return self._loop.run(self.async_store.append(
            key, incoming, max_messages=max_messages, lock_timeout=lock_timeout,
            idempotency=idempotency, tail=tail, **expiry))

    def history(self, key: StorageKey, *, last: int | None = None,
                before: int | None = None, **now: float) -> HistoryPage:
        return self._loop.run(self.async_store.history(key, last=last, before=before, **now))

    def edit(self, key: StorageKey, position: int, message: Message | None) -> bool:
        return self._loop.run(self.async_store.edit(key, position, message))

    def keys(self, scope: str, scope_id: str, *, prefix: str = "",
             after: str | None = None, limit: int = 100, **now: float) -> list[str]:
        return self._loop.run(self.async_store.keys(scope, scope_id, prefix=prefix,
                                                    after=after, limit=limit, **now))

    def __getattr__(self, name: str) -> Any:
        """``touch`` and ``sweep`` (retention) where the async store has them."""
        if name not in ("touch", "sweep"):
            raise AttributeError(name)
        method = getattr(self.async_store, name)
        return lambda *args, **kwargs: self._loop.run(method(*args, **kwargs))


    def erase(self, scope: str, scope_id: str, *, dry_run: bool = False) -> Erased:
        return self._loop.run(self.async_store.erase(scope, scope_id, dry_run=dry_run))

    def lock(self, key: StorageKey, timeout: float) -> _HeldLock:
        return _HeldLock(self._loop, self.async_store.lock(key, timeout))

    def close(self) -> None:
        try:
            self._loop.run(self.async_store.aclose())
        finally:
            self._loop.stop()
