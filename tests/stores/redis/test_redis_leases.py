"""MEM-12 on Redis: locks are leases, so a dead holder never stalls the others for long.

A writer PROCESS holding a conversation's lock (``store.lock``, sync or
asyncio face) is killed with SIGKILL: the next append on that conversation
still gets the lock (``serialized=True``) with a ``lock_timeout`` well under
the old 10 s lease — the dead holder's lease lapses within ``lock_ttl``
(1 s) because nobody renews it. The same after a Redis restart from its AOF
(a private ``redis-server`` this module starts; the shared one is only used
under the session's prefix). A live holder keeps its lease past many
``lock_ttl`` s (the renewer works). The waits are recorded as figures, never asserted.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends import unavailable
from figures import Figure
from flowmem import StorageKey, StoreUnavailable
from flowmem.messages import canonical_messages
from flowmem.stores.redis._aio import AsyncRedisStore
from flowmem.stores.redis._keys import key_names
from flowmem.stores.redis._store import RedisStore
from redis_support import raw_client, url_with

pytestmark = pytest.mark.skipif(unavailable("redis") is not None,
                                reason=unavailable("redis") or "")

BATCH = canonical_messages([{"role": "user", "content": "after the holder died"}])

_HOLDER = r"""
import asyncio, sys, time
from flowmem import StorageKey, StoreUnavailable
face, url, scope_id = sys.argv[1:4]
key = StorageKey("workflow", scope_id, "conv")
if face == "sync":
    from flowmem.stores.redis import RedisStore
    store = RedisStore.from_url(url)
    with store.lock(key, 5.0) as held:
        print("held" if held else "missed", flush=True)
        time.sleep(3600)
else:
    from flowmem.stores.redis._aio import AsyncRedisStore
    async def hold():
        store = AsyncRedisStore.from_url(url)
        async with store.lock(key, 5.0) as held:
            print("held" if held else "missed", flush=True)
            await asyncio.sleep(3600)
    asyncio.run(hold())
"""


def _holder(face: str, url: str, scope_id: str) -> subprocess.Popen[str]:
    """A writer process holding ``scope_id``'s lock until killed."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, face, url, scope_id],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    return proc


def _kill(proc: subprocess.Popen[str]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def _timed_append(store: RedisStore, key: StorageKey) -> tuple[bool, float]:
    began = time.perf_counter()
    outcome = store.append(key, BATCH, max_messages=None, lock_timeout=3.0)
    return outcome.serialized, time.perf_counter() - began


@pytest.mark.parametrize("face", ["sync", "async"])
def test_mem12_kill_9_of_a_holder_the_next_append_is_serialized(prefix: str, face: str,
        figure: Figure) -> None:
    url = url_with(prefix)
    store = RedisStore.from_url(url)
    waits: list[float] = []
    try:
        for _ in range(3):
            scope_id = f"t-{uuid.uuid4().hex}"
            key = StorageKey("workflow", scope_id, "conv")
            proc = _holder(face, url, scope_id)
            time.sleep(0.5)  # the holder renews meanwhile: killed at a random renewal phase
            _kill(proc)
            serialized, wait = _timed_append(store, key)
            assert serialized  # the lease lapsed well within lock_timeout (old lease: 10 s)
            waits.append(wait)
    finally:
        store.close()
    figure(f"\nMEM-12 Redis lease, {face} holder killed -9: next append waited "
          f"{', '.join(f'{w * 1000:.0f}' for w in waits)} ms (lock_ttl 1 s)")


@pytest.mark.parametrize("face", ["sync", "async"])
def test_mem12_a_live_holder_keeps_its_lease_past_many_lock_ttls(prefix: str, face: str) -> None:
    # a 1 s lease renewed every 1/3 s: a renewer starved for less than 2/3 s (a loaded
    # 2-core machine) keeps it; the holder holds it past three leases
    url = url_with(prefix, lock_ttl=1.0)
    key = StorageKey("workflow", f"t-{uuid.uuid4().hex}", "conv")
    store = RedisStore.from_url(url)

    async def async_hold() -> bool:
        holder = AsyncRedisStore.from_url(url)
        try:
            async with holder.lock(key, 1.0) as held:
                assert held
                await asyncio.sleep(3.2)  # past three leases
                outcome = await asyncio.to_thread(store.append, key, BATCH, max_messages=None,
                                                  lock_timeout=0.05)
                return outcome.serialized
        finally:
            await holder.aclose()

    try:
        if face == "sync":  # two leases of one store: one renewer thread keeps both
            holder = RedisStore.from_url(url)
            other = StorageKey("workflow", f"t-{uuid.uuid4().hex}", "conv")
            with holder.lock(key, 1.0) as held, holder.lock(other, 1.0) as held_too:
                assert held and held_too
                time.sleep(3.2)
                serialized = store.append(key, BATCH, max_messages=None,
                                          lock_timeout=0.05).serialized
                assert not store.append(other, BATCH, max_messages=None,
                                        lock_timeout=0.05).serialized
            holder.close()
        else:
            serialized = asyncio.run(async_hold())
        assert serialized is False  # still held: renewed, not lapsed
        assert store.append(key, BATCH, max_messages=None, lock_timeout=1.0).serialized
    finally:
        store.close()


# -- a Redis restart from its AOF --------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateRedis:
    """A redis-server of this test alone (AOF, fsync always), killable and restartable."""

    def __init__(self, directory: Path) -> None:
        self.port = _free_port()
        self.dir = directory
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(500):
            client = raw_client(self.url)
            try:
                if client.ping():
                    return
            except Exception:  # not up yet
                time.sleep(0.01)
            finally:
                client.close()
        raise RuntimeError("private redis-server did not start")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    if subprocess.run(["which", "redis-server"], capture_output=True).returncode:
        pytest.skip("redis-server is not installed")
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.kill()


def test_mem12_after_an_aof_restart_dead_holders_do_not_stall_appends(
        private_redis: PrivateRedis, figure: Figure) -> None:
    """Issue #10: locks of writers that died with Redis are leases restored from the
    AOF with their expiry; the next append gets the lock instead of waiting them out."""
    url = f"{private_redis.url}?prefix=aof"
    scope_id = f"t-{uuid.uuid4().hex}"
    key = StorageKey("workflow", scope_id, "conv")
    proc = _holder("sync", url, scope_id)
    _kill(proc)  # the holder and the server die together
    private_redis.kill()
    private_redis.start()
    client = raw_client(private_redis.url)
    try:
        ttl = client.pttl(key_names(b"aof", key).lock)
    finally:
        client.close()
    store = RedisStore.from_url(url)
    try:
        serialized, wait = _timed_append(store, key)
    finally:
        store.close()
    assert serialized
    figure(f"\nMEM-12 Redis lease after an AOF restart: lock restored with {ttl} ms left; "
          f"next append waited {wait * 1000:.0f} ms (lock_ttl 1 s)")


def test_both_faces_reconnect_and_reload_their_scripts_after_a_restart(
        private_redis: PrivateRedis) -> None:
    """A restart empties the script cache and drops every connection: the next append
    (sent on a fresh connection — the pool notices the closed one first, on asyncio
    too — its script reloaded on NOSCRIPT) lands whole, once, on both faces."""
    url = f"{private_redis.url}?prefix=restart"
    key = StorageKey("workflow", f"t-{uuid.uuid4().hex}", "conv")
    sync = RedisStore.from_url(url)

    async def run() -> None:
        store = AsyncRedisStore.from_url(url)
        try:
            assert (await store.append(key, BATCH, max_messages=None, lock_timeout=1.0)).count == 2
            private_redis.kill()
            private_redis.start()
            assert (await store.append(key, BATCH, max_messages=None, lock_timeout=1.0)).count == 3
        finally:
            await store.aclose()

    try:
        assert sync.append(key, BATCH, max_messages=None, lock_timeout=1.0).count == 1
        asyncio.run(run())
        assert sync.append(key, BATCH, max_messages=None, lock_timeout=1.0).count == 4
        assert sync.read(key) == (True, BATCH * 4)
    finally:
        sync.close()


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_frozen_server_is_store_unavailable_not_a_hang(private_redis: PrivateRedis,
                                                         face: str, figure: Figure) -> None:
    """SIGSTOP of the (private) server: an append raises StoreUnavailable, bounded by
    ``socket_timeout`` per round trip (the asyncio face bounds each round trip itself).

    The append is one script, already sent when the reply timed out: once the server
    runs again it may take effect — whole or not at all, like a SQL append whose
    ``COMMIT`` reply was lost (a retry is safe with an idempotency key)."""
    url = f"{private_redis.url}?prefix=frozen&socket_timeout=0.3"
    key = StorageKey("workflow", f"t-{uuid.uuid4().hex}", "conv")
    sync = RedisStore.from_url(url)
    sync.append(key, BATCH, max_messages=None, lock_timeout=1.0)
    assert private_redis.proc is not None

    async def async_append() -> None:
        store = AsyncRedisStore.from_url(url)
        try:
            await store.read(key)  # connected and scripts loaded before the freeze
            os.kill(pid, signal.SIGSTOP)
            await store.append(key, BATCH, max_messages=None, lock_timeout=1.0)
        finally:
            await store.aclose()

    pid = private_redis.proc.pid
    began = time.perf_counter()
    try:
        with pytest.raises(StoreUnavailable):
            if face == "sync":
                os.kill(pid, signal.SIGSTOP)
                sync.append(key, BATCH, max_messages=None, lock_timeout=1.0)
            else:
                asyncio.run(async_append())
        figure(f"\nRedis frozen, {face} append: StoreUnavailable after "
              f"{(time.perf_counter() - began) * 1000:.0f} ms (socket_timeout 0.3 s)")
    finally:
        os.kill(pid, signal.SIGCONT)
    found, stored = sync.read(key)
    assert found and stored in (BATCH, BATCH * 2)  # the frozen append: whole or absent
    sync.close()
