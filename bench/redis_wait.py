"""What ``?wait_replicas=1`` costs an append: a private Redis primary and replica.

    PYTHONPATH=src python bench/redis_wait.py [--appends 2000]

One thread, one ``RedisStore``, ``--appends`` appends of one user turn to one
conversation (window 50), with ``wait_replicas=0`` and ``=1`` alternately,
``ROUNDS`` runs each: the median microseconds per append, and the round trips
per append counted by a TCP proxy in a separate, shorter run. Both servers and
the client share this machine's cores, so the replica's acknowledgement costs
a context switch, not a network hop. Not a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root, not bench/ (see _common)
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench._common import SUPPORT, interleaved
from flowmem.messages import canonical_messages
from flowmem.scopes import StorageKey
from flowmem.stores.redis import RedisStore

sys.path.insert(0, SUPPORT)
from redis_replicas import start_replicated
from round_trip_proxy import CountingProxy, through

ROUNDS = 3
OPTIONS = {0: "", 1: "&wait_replicas=1&wait_timeout=5"}


def run(url: str, appends: int, proxy: CountingProxy | None = None) -> float:
    """Microseconds per append; with ``proxy`` (in front of ``url``'s server), round trips."""
    store = RedisStore.from_url(through(proxy, url) if proxy else url)
    key = StorageKey("workflow", uuid.uuid4().hex, "c")
    turn = canonical_messages([{"role": "user", "content": "x" * 200}])
    store.append(key, turn, max_messages=50, lock_timeout=5.0)
    trips, began = proxy.round_trips if proxy else 0, time.perf_counter()
    for _ in range(appends):
        store.append(key, turn, max_messages=50, lock_timeout=5.0)
    seconds = time.perf_counter() - began
    store.close()
    return (proxy.round_trips - trips) / appends if proxy else seconds / appends * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=2000)
    args = parser.parse_args()
    pair = start_replicated()
    try:
        base = f"redis://127.0.0.1:{pair.primary}/0?prefix=fmbench-{uuid.uuid4().hex[:8]}"
        micros = interleaved(ROUNDS, {n: lambda q=query: run(base + q, args.appends)
                                      for n, query in OPTIONS.items()})
        print("| wait_replicas | µs per append (median of 3) | round trips per append |")
        print("| --- | --- | --- |")
        for n, query in OPTIONS.items():
            with CountingProxy("127.0.0.1", pair.primary) as proxy:
                trips = run(base + query, 50, proxy)
            print(f"| {n} | {statistics.median(micros[n]):.0f} | {trips:.2f} |")
    finally:
        pair.stop()


if __name__ == "__main__":
    main()
