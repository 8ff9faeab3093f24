"""Group commit of ``AsyncMemory`` on SQLite (#14): appends/s with N concurrent tasks.

``python bench/group_commit_bench.py [--tasks 32] [--appends 2000] [--rounds 5]``

Compares, in ONE process with rounds interleaved (so background load hits
both alike), the asyncio SQLite store with group commit (queued appends share
one transaction, at most 64) against the same store with groups of one (every
append its own transaction: what the store did before), at
``synchronous=normal`` and ``full``. Each round appends ``--appends`` messages
of the seeded workload from ``--tasks`` tasks, each task to its own
conversation. The figure is the median over rounds of appends per second;
the ratio is what to read on a shared machine. Not a test: nothing asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.workload import conversation
from flowmem import AsyncMemory, ExecutionContext
from flowmem.stores.embedded_async import AsyncSQLiteStore
from flowmem.stores.sqlite import SQLiteStore
from flowmem.stores.sqlite_thread import MAX_GROUP

CTX = ExecutionContext(workflow_id="bench", session_id="bench")


async def _round(url: str, group: int, tasks: int, messages: list[dict[str, Any]],
                 tag: str) -> float:
    store = AsyncSQLiteStore(lambda: SQLiteStore.from_url(url), max_group=group)
    memory = AsyncMemory(store)
    share = len(messages) // tasks

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


def run(tasks: int, appends: int, rounds: int, workdir: Path) -> dict[str, list[float]]:
    messages = conversation(appends)
    figures: dict[str, list[float]] = {}
    for r in range(rounds):
        for sync in ("normal", "full"):
            url = f"sqlite:///{workdir / f'group-{sync}.db'}?synchronous={sync}"
            for group in (1, MAX_GROUP):
                rate = asyncio.run(_round(url, group, tasks, messages, f"r{r}g{group}"))
                figures.setdefault(f"{sync} group≤{group}", []).append(rate)
        print(f"round {r + 1}/{rounds} done", file=sys.stderr)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--appends", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        figures = run(args.tasks, args.appends, args.rounds, Path(tmp))
    print(f"AsyncMemory on SQLite, {args.tasks} tasks, {args.appends} appends per round, "
          f"median of {args.rounds} interleaved rounds\n")
    print("| synchronous | one transaction per append (before) | group commit | ratio |")
    print("|---|---:|---:|---:|")
    for sync in ("normal", "full"):
        alone = statistics.median(figures[f"{sync} group≤1"])
        grouped = statistics.median(figures[f"{sync} group≤{MAX_GROUP}"])
        print(f"| {sync} | {alone:,.0f} appends/s | {grouped:,.0f} appends/s | "
              f"{grouped / alone:.1f}× |")


if __name__ == "__main__":
    main()
