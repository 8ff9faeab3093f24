"""What a Redis append costs: on a cluster, waiting for a replica, under a retention policy.

    PYTHONPATH=src python -m bench.redis_appends cluster [--appends 4000] [--threads 8]
    PYTHONPATH=src python -m bench.redis_appends wait [--appends 2000]
    PYTHONPATH=src python -m bench.redis_appends retention [--rounds 6] [--appends 500]

``cluster``: appends/s on a standalone Redis vs a private 3-master Redis
Cluster, side by side. ``--threads`` threads of one process doing nothing but
``RedisStore.append`` of one user turn, spread over 1 or 64 conversations, on
the shared standalone server (a key prefix of its own, removed afterwards) and
on a private cluster; ``ROUNDS`` alternating runs each, medians.

``wait``: what ``?wait_replicas=1`` costs an append, on a private Redis
primary and replica. One thread, one ``RedisStore``, ``--appends`` appends of
one user turn to one conversation (window 50), with ``wait_replicas=0`` and
``=1`` alternately, ``ROUNDS`` runs each: the median microseconds per append,
and the round trips per append counted by a TCP proxy in a separate, shorter
run. Both servers and the client share this machine's cores, so the replica's
acknowledgement costs a context switch, not a network hop.

``retention``: what a retention policy costs an append, the same appends with
and without one. Rounds alternate between a memory with no policy and one with
an idle policy on the ``session`` scope (each round a fresh conversation of
``--appends`` one-message appends), so both see the same machine; the figure
is the ratio of their median (and p99) latencies, the medians of the rounds'.
Under the policy the append's one script also sets the expiry instant on every
key of the conversation (no round trip more). The keys it wrote are deleted
after.

Not a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid

from bench._common import SUPPORT, drop_redis_prefix, fresh_store, interleaved, table
from flowmem import ExecutionContext, Memory
from flowmem.messages import canonical_messages
from flowmem.scopes import StorageKey
from flowmem.stores.redis import RedisStore

sys.path.insert(0, SUPPORT)
from redis_cluster import start_cluster
from redis_replicas import start_replicated
from round_trip_proxy import CountingProxy, through

STANDALONE = "redis://127.0.0.1:6379/15"  # cluster's standalone side (a database of its own)
SHARED = "redis://127.0.0.1:6379/0"  # retention's
ROUNDS = 3
TURN = canonical_messages([{"role": "user", "content": "x" * 200}])
WAIT = {0: "", 1: "&wait_replicas=1&wait_timeout=5"}


def _prefix() -> str:
    return f"fmbench-{uuid.uuid4().hex[:8]}"


def _append(store: RedisStore, key: StorageKey) -> None:
    store.append(key, TURN, max_messages=50, lock_timeout=5.0)


def cluster_rate(url: str, conversations: int, appends: int, threads: int) -> float:
    """Appends/s of ``threads`` threads sharing one store, ``appends`` in all."""
    store = RedisStore.from_url(url)
    scope_id = uuid.uuid4().hex
    keys = [StorageKey("workflow", scope_id, f"c{n}") for n in range(conversations)]
    each = appends // threads
    start = threading.Barrier(threads + 1)

    def writer(t: int) -> None:
        start.wait()
        for i in range(each):
            _append(store, keys[(t + i * threads) % conversations])

    workers = [threading.Thread(target=writer, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    start.wait()
    began = time.perf_counter()
    for worker in workers:
        worker.join()
    seconds = time.perf_counter() - began
    store.close()
    return each * threads / seconds


def cluster(args: argparse.Namespace) -> None:
    prefix = _prefix()
    private = start_cluster(replicas=0)
    urls = {"standalone": STANDALONE, "cluster": private.url}
    try:
        rates = {conversations: interleaved(ROUNDS, {
                     name: lambda url=url, n=conversations: cluster_rate(
                         f"{url}?prefix={prefix}", n, args.appends, args.threads)
                     for name, url in urls.items()}) for conversations in (1, 64)}
    finally:
        private.stop()
        drop_redis_prefix(STANDALONE, prefix)  # this run's keys, nothing else
    print(f"{args.threads} threads, {args.appends} appends per run, median of {ROUNDS}")
    print("conversations  standalone/s  cluster/s  cluster/standalone")
    for conversations, got in rates.items():
        alone, spread = (statistics.median(got[name]) for name in urls)
        print(f"{conversations:>13}  {alone:>12.0f}  {spread:>9.0f}  {spread / alone:>18.2f}")


def wait_cost(url: str, appends: int, proxy: CountingProxy | None = None) -> float:
    """Microseconds per append; with ``proxy`` (in front of ``url``'s server), round trips."""
    store = RedisStore.from_url(through(proxy, url) if proxy else url)
    key = StorageKey("workflow", uuid.uuid4().hex, "c")
    _append(store, key)
    trips, began = proxy.round_trips if proxy else 0, time.perf_counter()
    for _ in range(appends):
        _append(store, key)
    seconds = time.perf_counter() - began
    store.close()
    return (proxy.round_trips - trips) / appends if proxy else seconds / appends * 1e6


def wait(args: argparse.Namespace) -> None:
    pair = start_replicated()
    try:
        base = f"redis://127.0.0.1:{pair.primary}/0?prefix={_prefix()}"
        micros = interleaved(ROUNDS, {n: lambda q=query: wait_cost(base + q, args.appends)
                                      for n, query in WAIT.items()})
        rows = []
        for n, query in WAIT.items():
            with CountingProxy("127.0.0.1", pair.primary) as proxy:
                trips = wait_cost(base + query, 50, proxy)
            rows.append([str(n), f"{statistics.median(micros[n]):.0f}", f"{trips:.2f}"])
        print(table(["wait_replicas", f"µs per append (median of {ROUNDS})",
                     "round trips per append"], rows, "lll"))
    finally:
        pair.stop()


def _latencies(memory: Memory, appends: int) -> tuple[float, float]:
    """One round: the median and p99 seconds of ``appends`` appends to a new conversation."""
    context = ExecutionContext(session_id=f"s{uuid.uuid4().hex}")
    took: list[float] = []
    for _ in range(appends):
        start = time.perf_counter()
        memory.append("session", "talk", {"role": "user", "content": "x"}, context=context)
        took.append(time.perf_counter() - start)
    took.sort()
    return took[len(took) // 2], took[int(len(took) * 0.99)]


def retention(args: argparse.Namespace) -> None:
    with fresh_store(SHARED, _prefix()) as base:  # this run's keys, removed after
        memories = {"none": Memory.from_url(base),
                    "idle": Memory.from_url(base, retention={"session": "10m"})}
        try:
            figures = interleaved(args.rounds, {name: lambda m=memory: _latencies(
                m, args.appends) for name, memory in memories.items()})
        finally:
            for memory in memories.values():
                memory.close()
    median = {name: statistics.median(m for m, _ in got) for name, got in figures.items()}
    p99 = {name: statistics.median(p for _, p in got) for name, got in figures.items()}
    print(f"median {median['none'] * 1e6:.0f} -> {median['idle'] * 1e6:.0f} us "
          f"({median['idle'] / median['none']:.2f}x), p99 {p99['none'] * 1e6:.0f} -> "
          f"{p99['idle'] * 1e6:.0f} us ({p99['idle'] / p99['none']:.2f}x)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("cluster", help="appends/s: standalone vs a private cluster")
    one.add_argument("--appends", type=int, default=4000, help="appends per run, all threads")
    one.add_argument("--threads", type=int, default=8)
    one.set_defaults(run=cluster)
    one = commands.add_parser("wait", help="µs per append: wait_replicas=0 vs 1")
    one.add_argument("--appends", type=int, default=2000, help="appends per run")
    one.set_defaults(run=wait)
    one = commands.add_parser("retention", help="append latency: no policy vs an idle one")
    one.add_argument("--rounds", type=int, default=6)
    one.add_argument("--appends", type=int, default=500, help="appends per round and memory")
    one.set_defaults(run=retention)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
