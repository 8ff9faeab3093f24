"""flowmem on a real Redis Cluster (a private 3-master cluster on free ports).

Through a plain one-node URL, ``redis://127.0.0.1:<port>/0``: cluster mode is
detected on connect. The full backend contract and the model test on both
faces; URL forms (seed lists, ``?cluster=``, a database other than 0); an
idempotent retry; 4 processes × 100 appends on one conversation; the
service's tokens and sessions and the CLI's token, sessions and export
commands. The failover test (kill -9 of a master under load) is in
``test_redis_cluster_failover.py``. The module's tests run on one xdist worker
(``xdist_group``), which starts one cluster for them all.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from contention import CONTEXT, KEY, SCOPE, WriterStats, audit, batch_process, standard_expected
from figures import Figure
from flowmem import ExecutionContext, Idempotency, Memory, StorageKey
from flowmem.errors import InvalidStoreURL, StoreError
from flowmem.messages import canonical_messages
from flowmem.store import DeleteOutcome, Store
from flowmem.stores.redis import AsyncRedisStore, RedisStore
from flowmem.testing import BlockingStore, StoreContract, store_model_test
from profiles import examples
from redis_cluster import PrivateCluster, cluster_unavailable, start_cluster

pytestmark = [pytest.mark.redis, pytest.mark.processes,
              pytest.mark.skipif(cluster_unavailable() is not None,
                                 reason=cluster_unavailable() or ""),
              pytest.mark.xdist_group("test_redis_cluster")]


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivateCluster]:
    started = start_cluster(replicas=0)
    yield started
    started.stop()


@pytest.fixture(scope="module")
def url(cluster: PrivateCluster) -> str:
    return f"{cluster.url}?prefix=fmc-{uuid.uuid4().hex[:8]}"


def _open(url: str, face: str) -> Store:
    if face == "async":
        return BlockingStore(AsyncRedisStore.from_url(url))
    return RedisStore.from_url(url)


class TestClusterContract(StoreContract):
    @pytest.fixture
    def store(self, url: str) -> Iterator[Store]:
        opened = RedisStore.from_url(url)
        assert opened.cluster
        yield opened
        opened.close()

    @pytest.fixture
    def reopen(self, url: str) -> Callable[[], Store]:
        return lambda: RedisStore.from_url(url)


class TestAsyncClusterContract(StoreContract):
    @pytest.fixture
    def store(self, url: str) -> Iterator[Store]:
        opened = _open(url, "async")
        yield opened
        opened.close()

    @pytest.fixture
    def reopen(self, url: str) -> Callable[[], Store]:
        return lambda: _open(url, "async")


@pytest.mark.parametrize("face", ["sync", "async"])
def test_the_model_test_on_the_cluster(url: str, face: str) -> None:
    """MEM-1/2/3/10/14 + window through the cluster's slot routing, on each face.

    The planning both topologies share runs on a single node (40 examples blocking,
    20 asyncio: ``tests/stores/test_store_contract.py``, ``test_async_store_contract.py``);
    a dozen a face here prove a conversation's keys travel together to their slot.
    Each example opens a client of its own; closing and reopening one mid-sequence
    (a new client discovering the slots, most of this test's time when it did) is
    the conformance suite's ``test_reopen_keeps_everything``, on both faces above.
    """
    store_model_test(lambda: _open(url, face), reopenable=False, max_examples=examples(12))


def test_one_url_both_topologies_and_its_forms(cluster: PrivateCluster, url: str) -> None:
    prefix = url.partition("?")[2]
    a, b, c = cluster.ports[:3]
    forms = [f"redis://127.0.0.1:{b},127.0.0.1:{c}/0?{prefix}",
             f"redis://127.0.0.1:{a}/0?{prefix}&node=127.0.0.1:{b}&node=127.0.0.1:{c}",
             f"redis://127.0.0.1:{c}/0?{prefix}&cluster=yes"]
    key = StorageKey("workflow", f"u-{uuid.uuid4().hex}", "conv")
    for n, form in enumerate(forms):
        store = RedisStore.from_url(form)
        try:
            assert store.cluster
            store.append(key, canonical_messages([{"role": "user", "content": str(n)}]),
                         max_messages=None, lock_timeout=1.0)
            assert store.keys(key.scope, key.scope_id) == ["conv"]
        finally:
            store.close()

    async def detected() -> bool:
        async with AsyncRedisStore.from_url(url) as store:
            await store.read(key)
            return store.cluster
    assert asyncio.run(detected())
    with pytest.raises(InvalidStoreURL, match="database 0"):
        RedisStore.from_url(f"redis://127.0.0.1:{a}/3")
    with pytest.raises(InvalidStoreURL, match="database 0"):
        RedisStore.from_url(f"redis://127.0.0.1:{a}/3?cluster=yes")
    with pytest.raises(InvalidStoreURL, match="several nodes"):
        RedisStore.from_url(f"redis://127.0.0.1:{a},127.0.0.1:{b}/0?cluster=no")
    forced = RedisStore.from_url(f"{url}&cluster=no")
    try:
        moved = 0
        for n in range(32):  # some of these keys live on another node than the URL's
            try:
                forced.read(StorageKey("workflow", f"m{n}", "conv"))
            except StoreError as exc:
                moved += "MOVED" in str(exc)
        assert moved
    finally:
        forced.close()


def test_many_first_uses_at_once_on_asyncio_connect_once(url: str) -> None:
    """Tasks that start together on a fresh asyncio store from a plain node URL: one of
    them detects the cluster and swaps the client, the others wait for it (a second
    probe would read a client being replaced)."""
    async def run() -> list[tuple[bool, Any]]:
        store = AsyncRedisStore.from_url(url)
        try:
            return await asyncio.gather(*(store.read(StorageKey("workflow", "first", f"k{n}"))
                                          for n in range(8)))
        finally:
            assert store.cluster
            await store.aclose()

    assert asyncio.run(run()) == [(False, None)] * 8


@pytest.mark.parametrize("face", ["sync", "async"])
def test_an_idempotent_retry_stores_once(url: str, face: str) -> None:
    store = _open(url, face)
    try:
        key = StorageKey("workflow", f"i-{uuid.uuid4().hex}", "conv")
        idem = Idempotency(f"k-{uuid.uuid4().hex}", "fp", 600.0, 1e9)
        turn = canonical_messages([{"role": "user", "content": "once"}])
        outcomes = [store.append(key, turn, max_messages=None, lock_timeout=1.0,
                                 idempotency=idem) for _ in range(3)]
        assert [o.replayed for o in outcomes] == [False, True, True]
        assert {(o.count, o.appended) for o in outcomes} == {(1, 1)}
        assert store.read(key) == (True, turn)
        assert store.keys(key.scope, key.scope_id) == ["conv"]
        store.write(key, {"v": 1}, idempotency=Idempotency(idem.key + "w", "w", 600.0, 1e9),
                    replace=True)
        delete = Idempotency(idem.key + "d", "d", 600.0, 1e9)
        assert store.delete(key, idempotency=delete) == DeleteOutcome(True, replayed=False)
        assert store.keys(key.scope, key.scope_id) == []
        # a retried delete replays in its one script, in the conversation's slot: a key
        # written again since stays, and stays listed
        store.write(key, {"v": 2})
        assert store.delete(key, idempotency=delete) == DeleteOutcome(True, replayed=True)
        assert store.read(key) == (True, {"v": 2})
        assert store.keys(key.scope, key.scope_id) == ["conv"]
    finally:
        store.close()


def test_four_processes_one_conversation(url: str, figure: Figure) -> None:
    processes, appends = 4, 100
    spawn = multiprocessing.get_context("spawn")
    barrier, queue = spawn.Barrier(processes), spawn.Queue()
    procs = [spawn.Process(target=batch_process, args=(url, f"p{p}", 1, appends, barrier, queue))
             for p in range(processes)]
    for proc in procs:
        proc.start()
    stats: list[WriterStats] = [queue.get(timeout=180) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    assert all(proc.exitcode == 0 for proc in procs)
    with Memory.from_url(url) as memory:
        messages = memory.read(SCOPE, KEY, context=CONTEXT).value
    expected = standard_expected([f"p{p}t0" for p in range(processes)], appends)
    result = audit(messages, expected)
    figure(f"\ncluster, {processes} processes x {appends} appends: {result.line()}")
    assert [e for s in stats for e in s.errors] == []
    assert result.lost == result.duplicates == result.order_violations == result.torn == 0
    assert result.stored == result.expected
    assert sum(s.appended for s in stats) == result.expected


def _cli(url: str, *args: str) -> str:
    result = CliRunner().invoke(main_command(), [*args, "--store", url])
    assert result.exit_code == 0, (result.output, result.exception)
    return str(result.output)


def main_command() -> Any:
    from flowmem.cli._main import main

    return main


def test_tokens_sessions_and_export_on_the_cluster(url: str) -> None:
    tokens = [_cli(url, "token", "create", "--user", f"u{n}").strip() for n in range(5)]
    listed = [json.loads(line) for line in _cli(url, "token", "list", "--json").splitlines()]
    assert len(listed) == 5 and {t["user_id"] for t in listed} == {f"u{n}" for n in range(5)}
    revoked = listed[2]["id"]
    _cli(url, "token", "revoke", revoked)
    left = [json.loads(line) for line in _cli(url, "token", "list", "--json").splitlines()]
    assert revoked not in {t["id"] for t in left} and len(left) == 4
    assert all(token.startswith("fm_") for token in tokens)

    sessions = [_cli(url, "sessions", "create", "--owner", "alice").strip() for _ in range(3)]
    sessions.append(_cli(url, "sessions", "create", "--owner", "bob").strip())
    mine = [json.loads(line)["id"] for line in
            _cli(url, "sessions", "list", "--user", "alice", "--json").splitlines()]
    assert sorted(mine) == sorted(sessions[:3])
    assert len(_cli(url, "sessions", "list", "--json").splitlines()) == 4

    user = f"exp-{uuid.uuid4().hex[:8]}"
    with Memory.from_url(url) as memory:
        context = ExecutionContext(user_id=user)
        for n in range(6):  # six conversations of one user: six slots, one index
            memory.append("user", f"c{n}", [{"role": "user", "content": f"m{n}"}],
                          context=context)
    lines = _cli(url, "export", "--scope", "user", "--user", user).splitlines()
    exported = [json.loads(line) for line in lines]
    assert len(exported) == 6
    assert {str(line.get("key")) for line in exported} == {f"c{n}" for n in range(6)}


def test_erasure_under_four_appending_processes_on_the_cluster(
        cluster: PrivateCluster, tmp_path: Path, figure: Figure) -> None:
    """The erasure race (tests/erasure) on a cluster: her conversations in many slots."""
    import redis

    from erasure_race import erasure_race
    from erasure_scan import redis_findings

    prefix = f"fme-{uuid.uuid4().hex[:8]}"
    client = redis.RedisCluster.from_url(cluster.url)
    try:
        figure(erasure_race(f"{cluster.url}?prefix={prefix}",
                            lambda needles: redis_findings(client, prefix, needles), tmp_path))
    finally:
        client.close()


@pytest.mark.parametrize("face", ["sync", "async"])
def test_retention_expires_every_key_of_a_conversation_on_its_slot(url: str,
                                                                   face: str) -> None:
    import time

    import redis

    store = _open(url, face)
    memory = Memory(store, retention={"session": 2.0})  # the real clock: Redis expires it
    context = ExecutionContext(session_id=f"s-{uuid.uuid4().hex}")
    client = redis.RedisCluster.from_url(url.partition("?")[0])
    try:
        started = time.monotonic()
        memory.append("session", "talk", [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}], context=context)
        listed = memory.keys("session", context=context)
        if time.monotonic() - started < 2.0:  # a stalled machine may outlive the retention
            assert listed == ["talk"]
        prefix = url.partition("prefix=")[2]
        tag = "{" + f"{prefix}:session:{context.session_id}:talk" + "}"
        parts = [f"{tag}:{part}" for part in ("meta", "pos", "body", "info", "res", "calls")]
        assert len({client.pexpiretime(part) for part in parts}) == 1  # one instant, one slot
        deadline = time.monotonic() + 10
        while client.exists(*parts) and time.monotonic() < deadline:
            time.sleep(0.02)  # polling the condition, bounded
        assert client.exists(*parts) == 0
        assert memory.keys("session", context=context) == []
    finally:
        client.close()
        store.close()
