"""``redis://…`` on asyncio — :class:`AsyncRedisStore`, the :class:`~flowmem.store.AsyncStore` face.

The same programs as :class:`~flowmem.stores.redis.RedisStore`
(:mod:`flowmem.stores.redis_programs`: the append's guess → plan → one script,
the optimistic retry, the MEM-12 lease and its bounded wait, the edit), run
by the asyncio driver on ``redis.asyncio.Redis``: no thread hop, and the
MEM-12 wait is ``asyncio.sleep`` so it never blocks the loop. Sync and async
writers on one Redis serialize on the same leases.

:meth:`AsyncRedisStore.from_url` needs no running loop and connects nothing:
the first operation connects and loads the scripts.

Cancellation. A cancelled call's ``CancelledError`` is thrown into its
program at the ``await`` where it struck: an append releases the lease it
may hold (one more round trip, on a fresh connection) and re-raises. The
append itself is one Lua script, so it took effect whole or not at all. If
even the release cannot run, the lease lapses within ``lock_ttl``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from ..errors import StoreError
from ..messages import Message
from ..scopes import StorageKey
from ..store import AppendOutcome, HistoryPage, Idempotency
from .redis import check_options
from .redis_drivers import AsyncGates, Driver, adrive, make_client, renew_task
from .redis_programs import Program, RedisPrograms, T, setup

__all__ = ["AsyncRedisStore"]


class AsyncRedisStore:
    """The Redis backend on asyncio (see :mod:`flowmem.stores.redis` for the design)."""

    def __init__(self, client: Any, *, prefix: str = "flowmem", lock_ttl: float = 1.0,
                 timeout: float | None = None) -> None:
        """``client``: a ``redis.asyncio.Redis`` reading raw bytes (no ``decode_responses``);
        ``timeout``: seconds one round trip may take (``None``: the client's own bounds)."""
        check_options(prefix, lock_ttl)
        self.prefix = prefix
        self.lock_ttl = lock_ttl
        self.programs = RedisPrograms(prefix.encode("utf-8", "surrogatepass"),
                                      max(1, int(lock_ttl * 1000)))
        self._driver = Driver(client, timeout)
        self._gates = AsyncGates()
        self._ready = False
        self._closed = False

    @classmethod
    def from_url(cls, url: str) -> AsyncRedisStore:
        """``redis://[user:pass@]host:port/db?prefix=flowmem&lock_ttl=1`` (as the sync store).

        Safe without a running event loop: nothing connects until first use.
        """
        client, prefix, lock_ttl, timeout = make_client(url, asyncio_face=True)
        return cls(client, prefix=prefix, lock_ttl=lock_ttl, timeout=timeout)

    async def _run(self, program: Program[T], what: str) -> T:
        if self._closed:
            program.close()
            raise StoreError("the store is closed")
        if not self._ready:  # the first use connects and loads the scripts
            await adrive(setup(), self._driver, "connect")
            self._ready = True
        return await adrive(program, self._driver, what)

    # -- the AsyncStore protocol ------------------------------------------------------
    async def read(self, key: StorageKey) -> tuple[bool, Any]:
        return await self._run(self.programs.read(key), "read")

    async def write(self, key: StorageKey, value: Any, *,
                    idempotency: Idempotency | None = None) -> None:
        await self._run(self.programs.write(key, value, idempotency), "write")

    async def delete(self, key: StorageKey, *, idempotency: Idempotency | None = None) -> bool:
        return await self._run(self.programs.delete(key, idempotency), "delete")

    async def append(self, key: StorageKey, incoming: Sequence[Message], *,
                     max_messages: int | None, lock_timeout: float,
                     idempotency: Idempotency | None = None, tail: int = 0) -> AppendOutcome:
        began = time.monotonic()
        async with self._gates.hold(key, lock_timeout) as queued:  # this store's tasks queue
            left = max(0.0, lock_timeout - (time.monotonic() - began)) if queued else 0.0
            program = self.programs.append(key, incoming, max_messages, left, idempotency,
                                            tail)
            return await self._run(program, "append")

    async def history(self, key: StorageKey, *, last: int | None = None,
                      before: int | None = None) -> HistoryPage:
        return await self._run(self.programs.history(key, last, before), "history")

    async def edit(self, key: StorageKey, position: int, message: Message | None) -> bool:
        """The administrative path (MEM-15): a version-checked rewrite under the lease."""
        return await self._run(self.programs.edit(key, position, message), "edit")

    async def keys(self, scope: str, scope_id: str, *, prefix: str = "",
                   after: str | None = None, limit: int = 100) -> list[str]:
        return await self._run(self.programs.keys(scope, scope_id, prefix, after, limit),
                               "keys")

    def lock(self, key: StorageKey, timeout: float) -> AbstractAsyncContextManager[bool]:
        """The MEM-12 lease of ``key``, renewed by a task while the block runs."""
        return self._hold(key, timeout)

    @asynccontextmanager
    async def _hold(self, key: StorageKey, timeout: float) -> AsyncIterator[bool]:
        names = self.programs.names(key)
        token = self.programs.new_token()
        if not await self._run(self.programs.acquire(names, token, timeout), "lock"):
            yield False
            return
        renewer = renew_task(lambda: self._run(self.programs.renew(names, token), "lock"),
                             self.lock_ttl / 3)
        try:
            yield True
        finally:
            renewer.cancel()
            try:
                await asyncio.wait([renewer])
            finally:
                if not self._closed:
                    await self._run(self.programs.release(names, token), "lock")

    async def aclose(self) -> None:
        """Release the connections; the store is unusable afterwards."""
        self._closed = True
        client = self._driver.client
        await (client.aclose() if hasattr(client, "aclose") else client.close())  # redis<5.0.1

    async def __aenter__(self) -> AsyncRedisStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
