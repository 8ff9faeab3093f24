"""Redis store, sync vs asyncio face: µs per append and appends/s, same workload, same run.

``python bench/redis_faces.py [--url redis://127.0.0.1:6379/15] [--appends 3000] [--writers 8]
[--rounds 3]``

Both faces run the same sans-I/O programs (flowmem.stores.redis_programs);
they differ only in the driver. Three figures per face:

* one writer, one message per append (rounds of user, assistant declaring a
  call, its result, answer) on one conversation: µs per append (median of
  sub-windows);
* ``--writers`` concurrent writers (threads on the sync face, tasks on one
  event loop on the asyncio face), each on its own conversation: appends/s;
* the same writers on ONE conversation (MEM-12 contention): appends/s.

The faces alternate for ``--rounds`` rounds (so background load hits both
alike) and each figure is the median over the rounds. Keys go under a fresh
prefix, deleted at the end. Not run by pytest.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
import uuid
from typing import Any

from flowmem import StorageKey
from flowmem.messages import Message, canonical_messages
from flowmem.stores import open_store

WINDOW = 50


def workload(n: int, tag: str) -> list[list[Message]]:
    """``n`` one-message appends: user, assistant declaring a call, its result, answer."""
    out: list[list[Message]] = []
    for i in range(n):
        call = f"{tag}-{i // 4}"
        raw: dict[str, Any] = [
            {"role": "user", "content": f"question {i}"},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": call, "type": "function",
                             "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": call, "content": "result"},
            {"role": "assistant", "content": f"answer {i}"},
        ][i % 4]
        out.append(canonical_messages([raw]))
    return out


def median_us(durations: list[float], per: int = 100) -> float:
    windows = [sum(durations[i:i + per]) / len(durations[i:i + per])
               for i in range(0, len(durations), per)]
    return statistics.median(windows) * 1e6


def sync_face(url: str, appends: int, writers: int) -> tuple[float, float, float]:
    store = open_store(url)
    try:
        key = StorageKey("workflow", uuid.uuid4().hex, "conv")
        durations = []
        for batch in workload(appends, "s"):
            began = time.perf_counter()
            store.append(key, batch, max_messages=WINDOW, lock_timeout=5.0)
            durations.append(time.perf_counter() - began)

        def run(shared: bool) -> float:
            shared_key = StorageKey("workflow", uuid.uuid4().hex, "conv")

            def writer(n: int) -> None:
                key = shared_key if shared else StorageKey("workflow", uuid.uuid4().hex, "c")
                for batch in workload(appends // writers, f"w{n}"):
                    store.append(key, batch, max_messages=WINDOW, lock_timeout=5.0)

            threads = [threading.Thread(target=writer, args=(n,)) for n in range(writers)]
            began = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            return (appends // writers * writers) / (time.perf_counter() - began)

        return median_us(durations), run(False), run(True)
    finally:
        store.close()


async def async_face(url: str, appends: int, writers: int) -> tuple[float, float, float]:
    from flowmem.stores.redis_async import AsyncRedisStore

    store = AsyncRedisStore.from_url(url)
    try:
        key = StorageKey("workflow", uuid.uuid4().hex, "conv")
        durations = []
        for batch in workload(appends, "a"):
            began = time.perf_counter()
            await store.append(key, batch, max_messages=WINDOW, lock_timeout=5.0)
            durations.append(time.perf_counter() - began)

        async def run(shared: bool) -> float:
            shared_key = StorageKey("workflow", uuid.uuid4().hex, "conv")

            async def writer(n: int) -> None:
                key = shared_key if shared else StorageKey("workflow", uuid.uuid4().hex, "c")
                for batch in workload(appends // writers, f"w{n}"):
                    await store.append(key, batch, max_messages=WINDOW, lock_timeout=5.0)

            began = time.perf_counter()
            await asyncio.gather(*(writer(n) for n in range(writers)))
            return (appends // writers * writers) / (time.perf_counter() - began)

        return median_us(durations), await run(False), await run(True)
    finally:
        await store.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--appends", type=int, default=3000)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    prefix = f"fmbench-{uuid.uuid4().hex[:10]}"
    url = f"{args.url}{'&' if '?' in args.url else '?'}prefix={prefix}"
    try:
        runs: dict[str, list[tuple[float, float, float]]] = {"sync (threads)": [],
                                                               "async (tasks)": []}
        for _ in range(args.rounds):
            runs["sync (threads)"].append(sync_face(url, args.appends, args.writers))
            try:
                runs["async (tasks)"].append(asyncio.run(
                    async_face(url, args.appends, args.writers)))
            except ImportError:
                runs.pop("async (tasks)", None)
        print(f"face            µs/append (1 writer)   appends/s ({args.writers} keys)   "
              f"appends/s ({args.writers} on 1 key)   [median of {args.rounds} rounds]")
        for name, figures in runs.items():
            us, spread, shared = (statistics.median(column) for column in zip(*figures,
                                                                            strict=True))
            print(f"{name:15} {us:20.0f}   {spread:21.0f}   {shared:23.0f}")
    finally:
        import redis

        client = redis.Redis.from_url(args.url)
        for pattern in ("{" + prefix + ":*", prefix + ":idx:*"):
            keys = list(client.scan_iter(match=pattern, count=1000))
            for start in range(0, len(keys), 500):
                client.delete(*keys[start:start + 500])
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
