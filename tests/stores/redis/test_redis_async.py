"""AsyncRedisStore beyond the public suite: both faces serialize on the same MEM-12
lease, tasks queued on one conversation keep the bound, ``from_url`` needs no
running loop and refuses what the sync store refuses, and a closed store refuses.

The public conformance suite and the model test run on this face with every other
backend's asyncio face, in ``tests/stores/test_async_store_contract.py``
(``open_async_store`` of a Redis URL is this store).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from backends import unavailable
from flowmem import InvalidStoreURL, StorageKey, StoreError
from flowmem.messages import canonical_messages
from flowmem.store import AppendOutcome, AsyncStore
from flowmem.stores.redis._aio import AsyncRedisStore
from flowmem.stores.redis._store import RedisStore
from redis_support import url_with

pytestmark = pytest.mark.skipif(unavailable("redis") is not None,
                                reason=unavailable("redis") or "")


def test_from_url_needs_no_loop_and_satisfies_the_protocol(prefix: str) -> None:
    store = AsyncRedisStore.from_url(url_with(prefix))  # no loop is running here
    assert isinstance(store, AsyncStore)

    async def use() -> tuple[bool, Any]:
        key = StorageKey("workflow", f"t-{uuid.uuid4().hex}", "v")
        await store.write(key, {"a": 1})
        found = await store.read(key)
        await store.aclose()
        with pytest.raises(StoreError, match="closed"):
            await store.read(key)
        return found

    assert asyncio.run(use()) == (True, {"a": 1})


def test_mem12_sync_and_async_writers_share_one_lease(prefix: str) -> None:
    """A sync holder makes an async append wait, and the reverse (one lease per key)."""
    key = StorageKey("workflow", f"t-{uuid.uuid4().hex}", "conv")
    sync = RedisStore.from_url(url_with(prefix))
    batch = canonical_messages([{"role": "user", "content": "x"}])

    async def run() -> None:
        store = AsyncRedisStore.from_url(url_with(prefix))
        try:
            with sync.lock(key, 1.0) as held:
                assert held
                outcome = await store.append(key, batch, max_messages=None, lock_timeout=0.05)
                assert (outcome.serialized, outcome.appended) == (False, 1)
            async with store.lock(key, 1.0) as held:
                assert held
                outcome = await asyncio.to_thread(sync.append, key, batch, max_messages=None,
                                                  lock_timeout=0.05)
                assert (outcome.serialized, outcome.appended) == (False, 1)
            outcome = await store.append(key, batch, max_messages=None, lock_timeout=1.0)
            assert (outcome.serialized, outcome.count) == (True, 3)
        finally:
            await store.aclose()

    try:
        asyncio.run(run())
    finally:
        sync.close()


def test_async_from_url_refuses_what_the_sync_store_refuses() -> None:
    for bad in ("redis://h/0?lock_ttl=soon", "redis://h/0?decode_responses=true",
                "redis://h/0?prefix=a{b}", "redis://h/0?lock_ttl=0", "redis://h/0?bogus=1"):
        with pytest.raises(InvalidStoreURL):
            AsyncRedisStore.from_url(bad)


def test_mem12_tasks_queued_on_one_conversation_keep_the_bound(prefix: str) -> None:
    """Tasks of one store queue per conversation in front of the lease; with the lease
    held elsewhere each still gives up after lock_timeout, unserialized and whole."""
    key = StorageKey("workflow", f"t-{uuid.uuid4().hex}", "conv")
    batch = canonical_messages([{"role": "user", "content": "x"}])

    async def run() -> list[AppendOutcome]:
        store = AsyncRedisStore.from_url(url_with(prefix))
        holder = AsyncRedisStore.from_url(url_with(prefix))
        try:
            async with holder.lock(key, 1.0) as held:
                assert held
                held_back = await asyncio.gather(*(
                    store.append(key, batch, max_messages=None, lock_timeout=0.1)
                    for _ in range(4)))
            free = await asyncio.gather(*(
                store.append(key, batch, max_messages=None, lock_timeout=2.0)
                for _ in range(4)))
            return [*held_back, *free]
        finally:
            await store.aclose()
            await holder.aclose()

    outcomes = asyncio.run(run())
    assert [o.serialized for o in outcomes] == [False] * 4 + [True] * 4
    assert sorted(o.count for o in outcomes) == list(range(1, 9))
