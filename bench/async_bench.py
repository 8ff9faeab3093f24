"""AsyncMemory against Memory (#12): event-loop health and throughput, per backend.

    python bench/async_bench.py [--appends 1000] [--tasks 8]
        [--postgres postgresql://127.0.0.1:5432/test] [--redis redis://127.0.0.1:6379/15]

1. **Event-loop health** (SQLite, default durability): a 1 ms ticker runs on
   the loop while ``--appends`` appends run from ``--tasks`` concurrent tasks;
   the longest stall (how late the ticker woke; the store is opened and
   warm before the ticker starts) is reported for blocking
   ``Memory`` calls made straight from the coroutines (what an async user
   without AsyncMemory does) and for ``AsyncMemory``.
2. **Throughput**: the same appends through ``AsyncMemory`` with ``--tasks``
   tasks, and through ``Memory`` with ``--tasks`` threads, per backend.

Each backend writes under a fresh key (and a fresh SQLite file / PostgreSQL
schema / Redis prefix that the run removes). Times are wall clock on this
machine: compare the faces within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flowmem.stores.embedded_async
import flowmem.stores.sqlite  # noqa: F401
from bench.workload import conversation
from flowmem import AsyncMemory, ExecutionContext, Memory

CTX = ExecutionContext(user_id="bench", workflow_id="wf")


def _batches(count: int, tasks: int) -> list[list[dict[str, Any]]]:
    stream = conversation(count)
    return [stream[i::tasks] for i in range(tasks)]


async def _ticker(stop: asyncio.Event, worst: list[float]) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        due = loop.time() + 0.001
        await asyncio.sleep(0.001)
        worst[0] = max(worst[0], loop.time() - due)


async def _appends(memory: Any, face: str, batches: list[list[dict[str, Any]]]) -> None:
    async def run(batch: list[dict[str, Any]], key: str) -> None:
        for message in batch:
            if face == "async":
                await memory.append("user", key, message, context=CTX)
            else:
                memory.append("user", key, message, context=CTX)
                await asyncio.sleep(0)

    await asyncio.gather(*(run(b, f"k{i}") for i, b in enumerate(batches)))


async def _stall(url: str, count: int, tasks: int, face: str) -> tuple[float, float]:
    """The longest loop stall while the appends run (the store opened and warm before)."""
    memory: Any = AsyncMemory.from_url(url) if face == "async" else Memory.from_url(url)
    warm = memory.append("user", "warm", {"role": "user", "content": "w"}, context=CTX)
    if face == "async":
        await warm
    batches = _batches(count, tasks)  # the workload is built before the ticker runs
    gc.collect()  # each face starts from the same heap: no collection of the last run's garbage
    stop, worst = asyncio.Event(), [0.0]
    ticker = asyncio.create_task(_ticker(stop, worst))
    await asyncio.sleep(0.01)
    start = time.perf_counter()
    await _appends(memory, face, batches)
    elapsed = time.perf_counter() - start
    stop.set()
    await ticker
    if face == "async":
        await memory.aclose()
    else:
        memory.close()
    return worst[0] * 1000, count / elapsed


def _threads(url: str, count: int, tasks: int) -> float:
    batches = _batches(count, tasks)
    with Memory.from_url(url) as memory:
        def run(batch: list[dict[str, Any]], key: str) -> None:
            for message in batch:
                memory.append("user", key, message, context=CTX)

        threads = [threading.Thread(target=run, args=(b, f"t{i}")) for i, b in enumerate(batches)]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return count / (time.perf_counter() - start)


def _urls(args: argparse.Namespace, tmp: str) -> dict[str, str]:
    tag = f"bench_{uuid.uuid4().hex[:8]}"
    urls = {"memory": "memory://", "sqlite": f"sqlite:///{tmp}/a.db"}
    if args.postgres:
        urls["postgresql"] = f"{args.postgres}{'&' if '?' in args.postgres else '?'}schema={tag}"
    if args.redis:
        urls["redis"] = f"{args.redis}{'&' if '?' in args.redis else '?'}prefix={tag}"
    return urls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--appends", type=int, default=1000)
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--postgres", default=None)
    parser.add_argument("--redis", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(f"## Event-loop health: {args.appends} SQLite appends from {args.tasks} tasks\n")
        print("| face | longest loop stall (ms) | appends/s |\n|---|---:|---:|")
        for face, label in (("blocking", "Memory called from coroutines"),
                            ("async", "AsyncMemory")):
            url = f"sqlite:///{tmp}/stall-{face}.db"
            stall, rate = asyncio.run(_stall(url, args.appends, args.tasks, face))
            print(f"| {label} | {stall:.1f} | {rate:,.0f} |")
        print(f"\n## Throughput: {args.appends} appends, {args.tasks} tasks vs threads\n")
        print("| backend | AsyncMemory, tasks (appends/s) | Memory, threads (appends/s) |")
        print("|---|---:|---:|")
        for name, url in _urls(args, tmp).items():
            asynced = asyncio.run(_stall(url, args.appends, args.tasks, "async"))[1]
            threaded = _threads(url, args.appends, args.tasks)
            print(f"| {name} | {asynced:,.0f} | {threaded:,.0f} |")


if __name__ == "__main__":
    main()
