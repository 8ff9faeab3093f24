"""``redis://…`` on asyncio — :class:`AsyncRedisStore`, the :class:`~flowmem.store.AsyncStore` face.

The same programs as :class:`~flowmem.stores.redis.RedisStore`
(:mod:`flowmem.stores.redis._programs`: the append's guess → plan → one script,
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

from ...errors import StoreError
from ...messages import Message
from ...retention import Expiry, Swept
from ...scopes import StorageKey
from ...store import AppendOutcome, DeleteOutcome, Erased, HistoryPage, Idempotency
from ._clients import cluster_enabled, make_client
from ._drivers import AsyncGates, Driver, adrive, renew_task
from ._programs import Pipe, Program, RedisPrograms, T, setup
from ._requests import confirmation, first_error
from ._store import check_options

__all__ = ["AsyncRedisStore"]


def _info() -> Program[Any]:
    reply = (yield Pipe((("INFO", "cluster"),)))[0]
    first_error([reply])
    return reply


class AsyncRedisStore:
    """The Redis backend on asyncio (see :mod:`flowmem.stores.redis` for the design)."""

    def __init__(self, client: Any, *, prefix: str = "flowmem", lock_ttl: float = 1.0,
                 timeout: float | None = None, url: str | None = None,
                 wait_replicas: int = 0, wait_timeout: float = 1.0) -> None:
        """``client``: a ``redis.asyncio.Redis`` or ``redis.asyncio.cluster.RedisCluster``
        reading raw bytes (no ``decode_responses``); ``timeout``: seconds one round trip
        may take (``None``: the client's own bounds); ``url``: the store URL the
        standalone ``client`` came from, if its first use is to detect a cluster;
        ``wait_replicas``, ``wait_timeout``: as :class:`~flowmem.stores.redis.RedisStore`."""
        from redis.asyncio.cluster import RedisCluster

        check_options(prefix, lock_ttl)
        confirm = confirmation(wait_replicas, wait_timeout)
        self.prefix = prefix
        self.lock_ttl = lock_ttl
        self.cluster = isinstance(client, RedisCluster)
        self.programs = RedisPrograms(prefix.encode("utf-8", "surrogatepass"),
                                      max(1, int(lock_ttl * 1000)), cluster=self.cluster,
                                      confirm=confirm)
        self._driver = Driver(client, timeout)
        self._gates = AsyncGates()
        self._detect = url
        self._ready = False
        self._connecting = asyncio.Lock()
        self._closed = False


    @classmethod
    def from_url(cls, url: str) -> AsyncRedisStore:
        """``redis://[user:pass@]host:port/db?prefix=flowmem&lock_ttl=1`` (as the sync store).

        Safe without a running event loop: nothing connects until first use, which
        also detects a Redis Cluster (``INFO cluster``) unless the URL names one.
        """
        client, parts, timeout = make_client(url, asyncio_face=True)
        detect = parts.cluster is None and len(parts.nodes) <= 1
        return cls(client, prefix=parts.prefix, lock_ttl=parts.lock_ttl, timeout=timeout,
                   url=url if detect else None, wait_replicas=parts.wait_replicas,
                   wait_timeout=parts.wait_timeout)

    async def _connect(self) -> None:
        """The first use: detect a cluster if asked, then :func:`setup` — once, however
        many tasks start at the same time (a second one would probe a client being
        replaced)."""
        async with self._connecting:
            if self._ready:
                return
            if self._detect is not None:
                info = (await adrive(_info(), self._driver, "connect"))
                if cluster_enabled(info):
                    standalone = self._driver.client
                    client, _, timeout = make_client(self._detect, asyncio_face=True,
                                                     cluster=True)
                    self._driver = Driver(client, timeout)
                    self.cluster = self.programs.cluster = True  # programs made before run after
                    await standalone.aclose()
                self._detect = None
            await adrive(setup(self.cluster), self._driver, "connect")
            self._ready = True

    async def _run(self, program: Program[T], what: str) -> T:
        if self._closed:
            program.close()
            raise StoreError("the store is closed")
        if not self._ready:  # the first use connects and loads the scripts
            await self._connect()
        return await adrive(program, self._driver, what)

    # -- the AsyncStore protocol ------------------------------------------------------
    async def read(self, key: StorageKey, *, now: float | None = None) -> tuple[bool, Any]:
        return await self._run(self.programs.read(key, now), "read")

    async def write(self, key: StorageKey, value: Any, *,
                    idempotency: Idempotency | None = None, replace: bool = False,
                    expiry: Expiry | None = None) -> bool:
        return await self._run(self.programs.write(key, value, idempotency, replace, expiry),
                               "write")

    async def delete(self, key: StorageKey, *,
                     idempotency: Idempotency | None = None) -> DeleteOutcome:
        return await self._run(self.programs.delete(key, idempotency), "delete")

    async def append(self, key: StorageKey, incoming: Sequence[Message], *,
                     max_messages: int | None, lock_timeout: float,
                     idempotency: Idempotency | None = None, tail: int = 0,
                     expiry: Expiry | None = None) -> AppendOutcome:
        began = time.monotonic()
        async with self._gates.hold(key, lock_timeout) as queued:  # this store's tasks queue
            left = max(0.0, lock_timeout - (time.monotonic() - began)) if queued else 0.0
            program = self.programs.append(key, incoming, max_messages, left, idempotency,
                                            tail, expiry)
            return await self._run(program, "append")

    async def history(self, key: StorageKey, *, last: int | None = None,
                      before: int | None = None, now: float | None = None) -> HistoryPage:
        return await self._run(self.programs.history(key, last, before, now), "history")

    # -- retention: Redis deletes expired keys itself -------------------------------------
    native_expiry = True
    """Expired data is deleted by Redis's own expiry (every key of it carries the
    instant), not by :meth:`sweep`."""

    async def touch(self, key: StorageKey, expiry: Expiry) -> bool:
        """Move a live key's expiry (``refresh_on_read``); whether it was there."""
        return await self._run(self.programs.touch(key, expiry), "read")

    async def sweep(self, now: float, *, batch: int = 500) -> Swept:
        """Nothing to delete: Redis deletes every key of expired data at its instant
        (until then reads at ``now`` see it absent). Counts nothing, ``done``."""
        if self._closed:
            raise StoreError("the store is closed")
        return Swept()

    async def edit(self, key: StorageKey, position: int, message: Message | None) -> bool:
        """The administrative path (MEM-15): a version-checked rewrite under the lease."""
        return await self._run(self.programs.edit(key, position, message), "edit")

    async def keys(self, scope: str, scope_id: str, *, prefix: str = "",
                   after: str | None = None, limit: int = 100,
             now: float | None = None) -> list[str]:
        return await self._run(self.programs.keys(scope, scope_id, prefix, after, limit, now),
                               "keys")

    async def erase(self, scope: str, scope_id: str, *, dry_run: bool = False) -> Erased:
        """The fence, key by key, a sweep (:mod:`flowmem.stores.redis._erasure`)."""
        return await self._run(self.programs.erase(scope, scope_id, dry_run), "erase")

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
