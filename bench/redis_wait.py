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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

from flowmem.messages import canonical_messages
from flowmem.scopes import StorageKey
from flowmem.stores.redis import RedisStore
from redis_replicas import start_replicated
from round_trip_proxy import CountingProxy, through

ROUNDS = 3
OPTIONS = {0: "", 1: "&wait_replicas=1&wait_timeout=5"}


def run(url: str, appends: int) -> float:
    """Microseconds per append."""
    store = RedisStore.from_url(url)
    key = StorageKey("workflow", uuid.uuid4().hex, "c")
    turn = canonical_messages([{"role": "user", "content": "x" * 200}])
    store.append(key, turn, max_messages=50, lock_timeout=5.0)
    began = time.perf_counter()
    for _ in range(appends):
        store.append(key, turn, max_messages=50, lock_timeout=5.0)
    seconds = time.perf_counter() - began
    store.close()
    return seconds / appends * 1e6


def round_trips(url: str, port: int, appends: int = 50) -> float:
    """Round trips per append, through a counting proxy in front of ``port``."""
    proxy = CountingProxy("127.0.0.1", port)
    try:
        store = RedisStore.from_url(through(proxy, url))
        key = StorageKey("workflow", uuid.uuid4().hex, "c")
        turn = canonical_messages([{"role": "user", "content": "x"}])
        store.append(key, turn, max_messages=50, lock_timeout=5.0)
        before = proxy.round_trips
        for _ in range(appends):
            store.append(key, turn, max_messages=50, lock_timeout=5.0)
        trips = (proxy.round_trips - before) / appends
        store.close()
    finally:
        proxy.close()
    return trips


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=2000)
    args = parser.parse_args()
    pair = start_replicated()
    try:
        base = f"redis://127.0.0.1:{pair.primary}/0?prefix=fmbench-{uuid.uuid4().hex[:8]}"
        micros: dict[int, list[float]] = {n: [] for n in OPTIONS}
        for _ in range(ROUNDS):
            for n, query in OPTIONS.items():
                micros[n].append(run(base + query, args.appends))
        print("| wait_replicas | µs per append (median of 3) | round trips per append |")
        print("| --- | --- | --- |")
        for n, query in OPTIONS.items():
            print(f"| {n} | {statistics.median(micros[n]):.0f} "
                  f"| {round_trips(base + query, pair.primary):.2f} |")
    finally:
        pair.stop()


if __name__ == "__main__":
    main()
