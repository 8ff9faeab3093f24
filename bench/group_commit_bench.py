"""Group commit of ``AsyncMemory`` on SQLite: appends/s with N concurrent tasks.

``python bench/group_commit_bench.py [--tasks 32] [--appends 2000] [--rounds 5]``

The asyncio SQLite store with group commit (queued appends share one
transaction, at most 64) against groups of one, at ``synchronous=normal`` and
``full``, rounds interleaved in ONE process; each task appends the seeded
workload to its own conversation. Medians over rounds. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: the repository root, not bench/ (see _common)
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench._common import interleaved
from bench.workload import conversation
from flowmem import AsyncMemory, ExecutionContext
from flowmem.stores.sqlite._aio import AsyncSQLiteStore
from flowmem.stores.sqlite._store import SQLiteStore
from flowmem.stores.sqlite._thread import MAX_GROUP

CTX = ExecutionContext(workflow_id="bench", session_id="bench")


async def _round(url: str, group: int, tasks: int, messages: list[dict[str, Any]]) -> float:
    memory = AsyncMemory(AsyncSQLiteStore(lambda: SQLiteStore.from_url(url), max_group=group))
    share, tag = len(messages) // tasks, uuid.uuid4().hex

    async def worker(t: int) -> None:
        for message in messages[t * share:(t + 1) * share]:
            await memory.append("session", f"{tag}-{t}", message, context=CTX)

    try:
        await memory.append("session", "warm", {"role": "user", "content": "hi"}, context=CTX)
        started = time.perf_counter()
        await asyncio.gather(*(worker(t) for t in range(tasks)))
        return share * tasks / (time.perf_counter() - started)
    finally:
        await memory.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--appends", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    messages = conversation(args.appends)
    with tempfile.TemporaryDirectory() as tmp:
        rates = interleaved(args.rounds, {(sync, group): lambda s=sync, g=group: asyncio.run(
            _round(f"sqlite:///{Path(tmp) / f'group-{s}.db'}?synchronous={s}", g, args.tasks,
                   messages)) for sync in ("normal", "full") for group in (1, MAX_GROUP)})
    print(f"AsyncMemory on SQLite, {args.tasks} tasks, {args.appends} appends per round, "
          f"median of {args.rounds} interleaved rounds\n")
    print("| synchronous | one transaction per append | group commit | ratio |")
    print("|---|---:|---:|---:|")
    for sync in ("normal", "full"):
        alone, grouped = (statistics.median(rates[sync, group]) for group in (1, MAX_GROUP))
        print(f"| {sync} | {alone:,.0f} appends/s | {grouped:,.0f} appends/s | "
              f"{grouped / alone:.1f}× |")


if __name__ == "__main__":
    main()
