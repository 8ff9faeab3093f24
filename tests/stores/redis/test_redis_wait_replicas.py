"""``?wait_replicas=N``: an acknowledged change is on N replicas, else OutcomeUnknown.

Against real private servers on free ports: a standalone primary with one
replica, and a 3-master, 3-replica Redis Cluster. The replica that should
confirm is paused with ``SIGSTOP`` (the primary still counts it connected; it
acknowledges nothing): a change is then applied on the primary but not
confirmed, so the store raises :class:`~flowmem.errors.OutcomeUnknown` (it may
not survive a failover) instead of acknowledging it. Once the replica is back
a retry with the same idempotency key replays, and the replay is confirmed.

On the cluster the ``WAIT`` must run on the script's own connection: redis-py
would otherwise send it to every primary and add up their replicas, and the
two healthy shards would "confirm" the paused shard's write. No time is
asserted; waits are for conditions. Run the cluster tests with ``-n 0``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from flowmem import Idempotency, StorageKey
from flowmem.errors import (
    IdempotencyConflict,
    InvalidStoreURL,
    OutcomeUnknown,
    StoreUnavailable,
)
from flowmem.messages import canonical_messages
from flowmem.store import AppendOutcome
from flowmem.stores.redis import AsyncRedisStore, RedisStore
from flowmem.stores.redis._clients import make_client
from flowmem.stores.redis._keys import key_names, split_url
from flowmem.stores.redis._programs import RedisPrograms
from flowmem.stores.redis._requests import Confirm, Pipe, confirmation
from redis_cluster import PrivateCluster, cli, cluster_unavailable, start_cluster
from redis_replicas import PrivateReplicated, start_replicated
from round_trip_proxy import CountingProxy, through

pytestmark = [pytest.mark.redis, pytest.mark.processes,
              pytest.mark.skipif(cluster_unavailable() is not None,
                                 reason=cluster_unavailable() or ""),
              pytest.mark.xdist_group("test_redis_wait_replicas")]
WAIT = "wait_replicas=1&wait_timeout=0.3"
"""A paused replica keeps every WAIT for its whole timeout: short, to keep the tests short."""
SURE = "wait_replicas=1&wait_timeout=5"
"""Where a healthy replica must confirm: long (a loaded machine can starve the replica
of CPU for most of a second), never a figure the test depends on."""


def _turn(text: str) -> list[Any]:
    return canonical_messages([{"role": "user", "content": text}])


def _idem(key: str, fingerprint: str = "fp") -> Idempotency:
    return Idempotency(key, fingerprint, 600.0, time.time())


# -- the options, no server ------------------------------------------------------------
def test_the_url_options_and_their_defaults() -> None:
    plain = split_url("redis://127.0.0.1:6379/0")
    assert (plain.wait_replicas, plain.wait_timeout) == (0, 1.0)
    asked = split_url("redis://127.0.0.1:6379/0?wait_replicas=2&wait_timeout=0.25&prefix=p")
    assert (asked.wait_replicas, asked.wait_timeout) == (2, 0.25)
    assert "wait_" not in asked.url  # flowmem's own: not passed to redis-py
    assert confirmation(0, 1.0) is None
    assert confirmation(2, 0.25) == Confirm(2, 250)


@pytest.mark.parametrize("query", ["wait_replicas=-1", "wait_replicas=one", "wait_timeout=0",
                                   "wait_timeout=nan", "wait_replicas=1&wait_timeout=10",
                                   "wait_replicas=1&wait_timeout=2&socket_timeout=1"])
def test_bad_wait_options_are_refused(query: str) -> None:
    with pytest.raises(InvalidStoreURL, match="wait_"):
        make_client(f"redis://127.0.0.1:6379/0?{query}", asyncio_face=False)


def test_a_changing_script_and_its_wait_are_one_round_trip_on_one_connection() -> None:
    programs = RedisPrograms(b"p", 1000, confirm=Confirm(1, 500))
    key = StorageKey("workflow", "w", "c")
    request = next(programs.write(key, {"v": 1}))
    assert isinstance(request, Pipe) and len(request.commands) == 2
    assert request.commands[0][0] == "EVALSHA" and request.commands[1] == ("WAIT", 1, 500)
    assert request.pin == key_names(b"p", key).keys[0]  # the script's node, on a cluster
    unconfirmed = next(RedisPrograms(b"p", 1000).write(key, {"v": 1}))
    assert isinstance(unconfirmed, Pipe) and len(unconfirmed.commands) == 1
    reads = next(programs.read(key))
    assert isinstance(reads, Pipe) and len(reads.commands) == 1  # reads wait for nothing


# -- a standalone primary and its replica ----------------------------------------------
@pytest.fixture(scope="module")
def pair() -> Iterator[PrivateReplicated]:
    started = start_replicated()
    yield started
    started.stop()


@pytest.fixture
def paused(pair: PrivateReplicated) -> Iterator[PrivateReplicated]:
    pair.pause()
    try:
        yield pair
    finally:
        pair.resume()
        pair.wait_synced()


def _append(url: str, face: str, key: StorageKey, text: str,
            idem: Idempotency | None = None) -> AppendOutcome:
    """One append through a store of its own (a connection of its own), on ``face``."""
    if face == "async":
        async def run() -> AppendOutcome:
            async with AsyncRedisStore.from_url(url) as store:
                return await store.append(key, _turn(text), max_messages=None,
                                          lock_timeout=2.0, idempotency=idem)
        return asyncio.run(run())
    store = RedisStore.from_url(url)
    try:
        return store.append(key, _turn(text), max_messages=None, lock_timeout=2.0,
                            idempotency=idem)
    finally:
        store.close()


def _texts(url: str, key: StorageKey) -> list[str]:
    """The conversation as the primary has it (reads wait for no replica)."""
    store = RedisStore.from_url(url)
    try:
        found, messages = store.read(key)
    finally:
        store.close()
    return [m["content"] for m in messages] if found else []


@pytest.mark.parametrize("face", ["sync", "async"])
def test_an_unconfirmed_append_is_outcome_unknown_then_a_retry_replays(
        pair: PrivateReplicated, face: str) -> None:
    base = f"{pair.url}?prefix=fmw-{uuid.uuid4().hex[:8]}"
    url, sure = f"{base}&{WAIT}", f"{base}&{SURE}"
    key = StorageKey("workflow", "w", f"c-{face}")
    assert not _append(sure, face, key, "first").replayed  # a healthy replica confirms
    idem = _idem(f"second-{face}")
    pair.pause()
    try:
        with pytest.raises(OutcomeUnknown, match="not confirm") as raised:
            _append(url, face, key, "second", idem)
        assert "same idempotency key" in str(raised.value)
        assert _texts(url, key) == ["first", "second"]  # applied on the primary
        with pytest.raises(OutcomeUnknown, match="not confirm"):
            _append(url, face, key, "second", idem)  # a replay is confirmed too: not yet
    finally:
        pair.resume()
    pair.wait_synced()
    again = _append(sure, face, key, "second", idem)
    assert again.replayed and again.count == 2
    assert _texts(base, key) == ["first", "second"]
    replica = f"redis://127.0.0.1:{pair.replica}/0?{base.partition('?')[2]}"
    assert _texts(replica, key) == ["first", "second"]


def test_writes_deletes_edits_and_erasures_are_confirmed(pair: PrivateReplicated) -> None:
    """Each change is applied on the primary and not acknowledged while the replica is
    paused; an erasure run again once it is back completes."""
    base = f"{pair.url}?prefix=fmw-{uuid.uuid4().hex[:8]}"
    value = StorageKey("user", "u1", "v")
    chat = StorageKey("user", "u1", "chat")
    plain = RedisStore.from_url(base)
    store = RedisStore.from_url(f"{base}&{WAIT}")
    try:
        plain.append(chat, _turn("hello"), max_messages=None, lock_timeout=1.0)
        plain.write(value, 1)
        pair.pause()
        try:
            with pytest.raises(OutcomeUnknown, match="not confirm"):
                store.write(value, 2)
            assert plain.read(value) == (True, 2)
            with pytest.raises(OutcomeUnknown, match="not confirm"):
                store.delete(value)
            assert plain.read(value) == (False, None)
            with pytest.raises(OutcomeUnknown, match="not confirm"):
                store.edit(chat, 0, _turn("edited")[0])
            assert _texts(base, chat) == ["edited"]
            with pytest.raises(OutcomeUnknown, match="not confirm"):
                store.erase("user", "u1")
            assert plain.read(chat) == (False, None)
        finally:
            pair.resume()
        pair.wait_synced()
        again = RedisStore.from_url(f"{base}&{SURE}")
        try:
            assert again.erase("user", "u1").conversations == 0  # the fence comes down
        finally:
            again.close()
        plain.write(value, 3)  # not refused: the erasure is over
    finally:
        store.close()
        plain.close()


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_confirmed_append_is_still_one_round_trip(pair: PrivateReplicated, face: str) -> None:
    """The WAIT rides in the script's round trip: the common append and its replay stay
    ONE round trip each (counted by a TCP proxy in front of the primary)."""
    proxy = CountingProxy("127.0.0.1", pair.primary)
    url = through(proxy, f"{pair.url}?prefix=fmw-{uuid.uuid4().hex[:8]}&{SURE}")
    key = StorageKey("workflow", "w", f"rt-{face}")
    idem = _idem(f"rt-{face}")

    async def run() -> list[int]:
        async with AsyncRedisStore.from_url(url) as store:
            await store.read(key)  # connects, loads the scripts
            trips = []
            for text, once in (("one", None), ("two", idem), ("two", idem)):
                before = proxy.round_trips
                await store.append(key, _turn(text), max_messages=None, lock_timeout=2.0,
                                   idempotency=once)
                trips.append(proxy.round_trips - before)
            return trips

    try:
        if face == "async":
            trips = asyncio.run(run())
        else:
            store = RedisStore.from_url(url)
            try:
                store.read(key)
                trips = []
                for text, once in (("one", None), ("two", idem), ("two", idem)):
                    before = proxy.round_trips
                    store.append(key, _turn(text), max_messages=None, lock_timeout=2.0,
                                 idempotency=once)
                    trips.append(proxy.round_trips - before)
            finally:
                store.close()
    finally:
        proxy.close()
    assert trips == [1, 1, 1]  # created, appended, replayed


def test_a_refusal_is_reported_as_itself(paused: PrivateReplicated) -> None:
    """A script that changed nothing (here a reused idempotency key) is not turned into
    OutcomeUnknown by the WAIT after it."""
    base = f"{paused.url}?prefix=fmw-{uuid.uuid4().hex[:8]}"
    key = StorageKey("workflow", "w", "c")
    plain = RedisStore.from_url(base)
    store = RedisStore.from_url(f"{base}&{WAIT}")
    try:
        plain.append(key, _turn("one"), max_messages=None, lock_timeout=1.0,
                     idempotency=_idem("k", "first"))
        with pytest.raises(IdempotencyConflict):
            store.append(key, _turn("two"), max_messages=None, lock_timeout=1.0,
                         idempotency=_idem("k", "other"))
    finally:
        store.close()
        plain.close()


def test_more_replicas_than_there_are_is_never_confirmed(pair: PrivateReplicated) -> None:
    store = RedisStore.from_url(f"{pair.url}?prefix=fmw-{uuid.uuid4().hex[:8]}"
                                f"&wait_replicas=2&wait_timeout=0.2")
    try:
        with pytest.raises(OutcomeUnknown, match=r"2 replica\(s\) did not confirm"):
            store.write(StorageKey("global", "", "v"), 1)
    finally:
        store.close()


# -- a Redis Cluster: the WAIT on the script's own node and connection -----------------
@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivateCluster]:
    started = start_cluster(replicas=1)
    yield started
    started.stop()


def _master_of(cluster: PrivateCluster, prefix: str, key: StorageKey,
               part: str = "value") -> int:
    """The port of the master serving ``key``'s data (or its scope ``index``)."""
    client = redis.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    name = getattr(key_names(prefix.encode(), key), part)
    try:
        return int(client.get_node_from_key(name).port)
    finally:
        client.close()


@pytest.mark.parametrize("face", ["sync", "async"])
def test_cluster_an_append_waits_for_its_own_shards_replica(cluster: PrivateCluster,
                                                            face: str) -> None:
    prefix = f"fmw-{uuid.uuid4().hex[:8]}"
    url, sure = f"{cluster.url}?prefix={prefix}&{WAIT}", f"{cluster.url}?prefix={prefix}&{SURE}"
    keys = [StorageKey("workflow", "w", f"c{n}") for n in range(12)]
    masters = {k: _master_of(cluster, prefix, k) for k in keys}
    index = _master_of(cluster, prefix, keys[0], part="index")  # where the keys are listed
    key = next(k for k in keys if masters[k] != index)  # its listing stays confirmable
    elsewhere = next(k for k in keys if masters[k] != masters[key])
    replica = cluster.replica_of(masters[key])
    idem = _idem(f"second-{face}")
    assert not _append(sure, face, key, "first").replayed
    cluster.pause(replica)
    try:
        with pytest.raises(OutcomeUnknown, match="WAIT counted 0"):
            _append(url, face, key, "second", idem)  # 2 healthy shards do not confirm it
        assert _texts(url, key) == ["first", "second"]  # applied on its primary
        assert not _append(sure, face, elsewhere, "other shard").replayed  # confirmed there
    finally:
        cluster.resume(replica)
    cluster.wait_ok()
    cluster.wait_synced()
    again = _append(sure, face, key, "second", idem)
    assert again.replayed and again.count == 2
    assert _texts(url, key) == ["first", "second"]



def test_cluster_a_lagging_replica_promoted_loses_no_acknowledged_append(
        cluster: PrivateCluster) -> None:
    """The failure ``wait_replicas`` exists for, made deterministic: a master whose
    replica has fallen behind dies, and the replica takes over without its last writes.

    The replica is paused and its link cut, so nothing the master writes next reaches
    it. Without ``wait_replicas`` an append is acknowledged there and lost with the
    failover; with it, the append is OutcomeUnknown, and its retry with the same key —
    once the old master is back as the new master's replica — stores it once."""
    prefix = f"fmw-{uuid.uuid4().hex[:8]}"
    plain = RedisStore.from_url(f"{cluster.url}?prefix={prefix}")
    waiting = RedisStore.from_url(f"{cluster.url}?prefix={prefix}&{WAIT}")
    sure = RedisStore.from_url(f"{cluster.url}?prefix={prefix}&{SURE}")
    key = StorageKey("workflow", "w", "lag")
    master = _master_of(cluster, prefix, key)
    replica = cluster.replica_of(master)
    idem = _idem("second")

    def append(store: RedisStore, text: str, idem: Idempotency | None = None) -> AppendOutcome:
        return store.append(key, _turn(text), max_messages=None, lock_timeout=2.0,
                            idempotency=idem)

    try:
        append(sure, "first")
        cluster.pause(replica)
        cli(master, "client", "kill", "type", "replica")  # the link is gone: it lags
        append(plain, "acknowledged, then lost")
        with pytest.raises(OutcomeUnknown, match="WAIT counted 0"):
            append(waiting, "second", idem)
        cluster.kill(master)
        cluster.resume(replica)
        cluster.wait_ok(replaced=master)  # the lagging replica took over
        cluster.restart(master)  # back as its replica: the shard can confirm again
        deadline = time.monotonic() + 60
        while True:
            try:
                again = append(sure, "second", idem)
                break
            except StoreUnavailable:  # OutcomeUnknown included: the same key again
                assert time.monotonic() < deadline, "the retry was never acknowledged"
        assert again.count == 2  # stored anew (the first attempt went with the old master)
        # the acknowledged plain append is gone; the confirmed ones are there, once
        assert _texts(cluster.url + f"?prefix={prefix}", key) == ["first", "second"]
    finally:
        waiting.close()
        sure.close()
        plain.close()
