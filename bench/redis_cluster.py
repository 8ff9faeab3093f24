"""Appends/s on a standalone Redis vs a private 3-master Redis Cluster, side by side.

    PYTHONPATH=src python bench/redis_cluster.py [--appends 4000] [--threads 8]

``--threads`` threads of one process doing nothing but ``RedisStore.append`` of
one user turn, spread over 1 or 64 conversations, on the shared standalone
server (a key prefix of its own, removed afterwards) and on a private cluster;
``ROUNDS`` alternating runs each, medians. Not a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root, not bench/ (see _common)
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench._common import SUPPORT, drop_redis_prefix, interleaved
from flowmem.messages import canonical_messages
from flowmem.scopes import StorageKey
from flowmem.stores.redis import RedisStore

sys.path.insert(0, SUPPORT)
from redis_cluster import start_cluster

STANDALONE = "redis://127.0.0.1:6379/15"
ROUNDS = 3


def run(url: str, conversations: int, appends: int, threads: int) -> float:
    """Appends/s of ``threads`` threads sharing one store, ``appends`` in all."""
    store = RedisStore.from_url(url)
    scope_id = uuid.uuid4().hex
    keys = [StorageKey("workflow", scope_id, f"c{n}") for n in range(conversations)]
    turn = canonical_messages([{"role": "user", "content": "x" * 200}])
    each = appends // threads
    start = threading.Barrier(threads + 1)

    def writer(t: int) -> None:
        start.wait()
        for i in range(each):
            store.append(keys[(t + i * threads) % conversations], turn, max_messages=50,
                         lock_timeout=5.0)

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=4000)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    prefix = f"fmbench-{uuid.uuid4().hex[:8]}"
    cluster = start_cluster(replicas=0)
    urls = {"standalone": STANDALONE, "cluster": cluster.url}
    try:
        rates = {conversations: interleaved(ROUNDS, {
                     name: lambda url=url, n=conversations: run(
                         f"{url}?prefix={prefix}", n, args.appends, args.threads)
                     for name, url in urls.items()}) for conversations in (1, 64)}
    finally:
        cluster.stop()
        drop_redis_prefix(STANDALONE, prefix)  # this run's keys, nothing else
    print(f"{args.threads} threads, {args.appends} appends per run, median of {ROUNDS}")
    print("conversations  standalone/s  cluster/s  cluster/standalone")
    for conversations, got in rates.items():
        alone, spread = (statistics.median(got[name]) for name in urls)
        print(f"{conversations:>13}  {alone:>12.0f}  {spread:>9.0f}  {spread / alone:>18.2f}")


if __name__ == "__main__":
    main()
