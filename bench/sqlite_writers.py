"""Two processes appending to one SQLite file: append latency with and without write turns.

``python bench/sqlite_writers.py [--rounds 3] [--seconds 4] [--tasks 32]``

Each round starts two processes twice — their asyncio SQLite stores with
``queue_writers`` off (SQLite's busy handler decides who writes next), then on
(``stores/sqlite_writer.py``: the processes queue on a byte of the lock file
and take turns) — each running ``--tasks`` tasks that append user turns to
their own conversations for ``--seconds``. Prints, per process, the appends
made and the p50 / p99 / max latency of one append in ms. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(path: str, queued: bool, seconds: float, tasks: int, tag: str) -> None:
    """One process: ``tasks`` tasks appending for ``seconds``; prints its figures as JSON."""
    from flowmem.messages import canonical_messages
    from flowmem.scopes import StorageKey
    from flowmem.stores.embedded_async import AsyncSQLiteStore
    from flowmem.stores.sqlite import SQLiteStore

    async def run() -> list[float]:
        store = AsyncSQLiteStore(lambda: SQLiteStore.from_url(f"sqlite:///{path}",
                                                              queue_writers=queued))
        latencies: list[float] = []
        end = time.monotonic() + seconds

        async def appender(n: int) -> None:
            key = StorageKey("session", f"{tag}{n}", "turns")
            count = 0
            while time.monotonic() < end:
                began = time.monotonic()
                await store.append(key, canonical_messages(
                    [{"role": "user", "content": f"turn {count}"}]),
                    max_messages=None, lock_timeout=5.0)
                latencies.append(time.monotonic() - began)
                count += 1

        await asyncio.gather(*(appender(n) for n in range(tasks)))
        await store.aclose()
        return sorted(latencies)

    done = asyncio.run(run())
    print(json.dumps({"appends": len(done), "p50": done[len(done) // 2] * 1000,
                      "p99": done[int(len(done) * 0.99)] * 1000, "max": done[-1] * 1000}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        path, queued, tag = args.child
        child(path, queued == "1", args.seconds, args.tasks, tag)
        return 0
    print("| round | write turns | process A: appends, p50 / p99 / max ms "
          "| process B: appends, p50 / p99 / max ms |")
    print("|---:|---|---|---|")
    for number in range(1, args.rounds + 1):
        for queued in ("0", "1"):
            with tempfile.TemporaryDirectory() as workdir:
                path = str(Path(workdir) / "writers.db")
                subprocess.run([sys.executable, "-c", "from flowmem.stores.sqlite import "
                                f"SQLiteStore; SQLiteStore({path!r}).close()"], check=True)
                children = [subprocess.Popen(
                    [sys.executable, __file__, "--seconds", str(args.seconds), "--tasks",
                     str(args.tasks), "--child", path, queued, tag],
                    stdout=subprocess.PIPE, text=True) for tag in "ab"]
                figures = [json.loads(c.communicate()[0]) for c in children]
            cells = [f"{f['appends']:,}, {f['p50']:.1f} / {f['p99']:.1f} / {f['max']:.0f}"
                     for f in figures]
            print(f"| {number} | {'on' if queued == '1' else 'off'} | {cells[0]} | {cells[1]} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
