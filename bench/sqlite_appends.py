"""What an SQLite append costs: pages and statements it writes, and group commit's rate.

    python -m bench.sqlite_appends pages [--length 10000] [--appends 2000]
    python -m bench.sqlite_appends group-commit [--tasks 32] [--appends 2000] [--rounds 5]

``pages``: counts, not times, so the figures are the same on a loaded machine.
A conversation of the seeded workload is prefilled to ``--length`` messages,
then ``--appends`` more are appended one per call through
:class:`flowmem.Memory` at ``synchronous=normal``, and the same messages
through the raw sqlite3 floor of the comparison (one ``INSERT`` a
transaction). For each append it records the pages the commit wrote to the
WAL (the growth of the ``-wal`` file, checkpoints off) and the statements
run (``sqlite3``'s trace callback), and prints the mean per kind of message:
where the cost of the MEM-1 unique key, the MEM-2 declarations and the MEM-3
pending calls lands.

``group-commit``: appends/s of ``AsyncMemory`` with N concurrent tasks. The
asyncio SQLite store with group commit (queued appends share one transaction,
at most 64) against groups of one, at ``synchronous=normal`` and ``full``,
rounds interleaved in ONE process; each task appends the seeded workload to
its own conversation. Medians over rounds.

Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from bench._common import interleaved, table
from bench.contenders.baselines import RawSQLiteWALNormal
from bench.workload import conversation
from flowmem import AsyncMemory, ExecutionContext, Memory
from flowmem.messages import Message
from flowmem.stores.sqlite._aio import AsyncSQLiteStore
from flowmem.stores.sqlite._store import SQLiteStore
from flowmem.stores.sqlite._thread import MAX_GROUP

FRAME = 4096 + 24  # a WAL frame: one page and its header
CONTEXT = ExecutionContext(workflow_id="bench", session_id="bench")
Counts = dict[str, tuple[float, float, int]]  # kind -> (pages, statements, appends)


def measure(conn: sqlite3.Connection, wal: Path, append: Callable[[Message], None],
            messages: list[Message]) -> Counts:
    """Pages and statements per append, by kind of message."""
    statements = [0]
    conn.set_trace_callback(lambda _sql: statements.__setitem__(0, statements[0] + 1))
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for message in messages:
        before, statements[0] = os.path.getsize(wal), 0
        append(message)
        calls = message["role"] == "assistant" and message.get("tool_calls")
        row = sums["assistant declaring calls" if calls else str(message["role"])]
        row[0] += (os.path.getsize(wal) - before) / FRAME
        row[1] += statements[0]
        row[2] += 1
    conn.set_trace_callback(None)
    return {k: (v[0] / v[2], v[1] / v[2], int(v[2])) for k, v in sums.items()}


def flowmem_side(workdir: Path, prefix: list[Message], timed: list[Message]) -> Counts:
    path = workdir / "flowmem.db"
    memory = Memory.from_url(f"sqlite:///{path}?synchronous=normal")
    for start in range(0, len(prefix), 500):
        memory.append("session", "chat", prefix[start:start + 500], context=CONTEXT)
    conn = memory.store._connection()  # type: ignore[attr-defined]
    result = measure(conn, Path(f"{path}-wal"),
                     lambda m: memory.append("session", "chat", m, context=CONTEXT), timed)
    memory.close()
    return result


def floor_side(workdir: Path, prefix: list[Message], timed: list[Message]) -> Counts:
    floor = RawSQLiteWALNormal()
    floor.open(workdir)
    floor.prefill("chat", prefix)
    result = measure(floor.conn, workdir / "raw.db-wal", lambda m: floor.append("chat", m), timed)
    floor.close()
    return result


def pages(args: argparse.Namespace) -> None:
    messages = conversation(args.length + args.appends)
    prefix, timed = messages[:args.length], messages[args.length:]
    with tempfile.TemporaryDirectory(prefix="flowmem-pages-") as tmp:
        ours, floor = (side(Path(tmp), prefix, timed) for side in (flowmem_side, floor_side))
    count = sum(n for _, _, n in ours.values())
    total = [sum(side[k][i] * side[k][2] for k in side) / count
             for i, side in ((0, ours), (0, floor), (1, ours), (1, floor))]
    rows = [[name, f"{n:,}", f"{p:.2f}", f"{floor[name][0]:.2f}", f"{s:.2f}",
             f"{floor[name][1]:.2f}"] for name, (p, s, n) in sorted(ours.items())]
    rows.append(["**all**", f"{count:,}", *(f"**{x:.2f}**" for x in total)])
    print(f"Pages written and statements run per append at {args.length:,} messages "
          f"({args.appends:,} appends, synchronous=normal)\n")
    print(table(["message", "appends", "flowmem pages", "floor pages", "flowmem statements",
                 "floor statements"], rows))


async def _group_round(url: str, group: int, tasks: int, messages: list[Message]) -> float:
    memory = AsyncMemory(AsyncSQLiteStore(lambda: SQLiteStore.from_url(url), max_group=group))
    share, tag = len(messages) // tasks, uuid.uuid4().hex

    async def worker(t: int) -> None:
        for message in messages[t * share:(t + 1) * share]:
            await memory.append("session", f"{tag}-{t}", message, context=CONTEXT)

    try:
        await memory.append("session", "warm", {"role": "user", "content": "hi"}, context=CONTEXT)
        started = time.perf_counter()
        await asyncio.gather(*(worker(t) for t in range(tasks)))
        return share * tasks / (time.perf_counter() - started)
    finally:
        await memory.aclose()


def group_commit(args: argparse.Namespace) -> None:
    messages = conversation(args.appends)
    with tempfile.TemporaryDirectory() as tmp:
        rates = interleaved(args.rounds, {(sync, group): lambda s=sync, g=group: asyncio.run(
            _group_round(f"sqlite:///{Path(tmp) / f'group-{s}.db'}?synchronous={s}", g,
                         args.tasks, messages))
            for sync in ("normal", "full") for group in (1, MAX_GROUP)})
    rows = []
    for sync in ("normal", "full"):
        alone, grouped = (statistics.median(rates[sync, group]) for group in (1, MAX_GROUP))
        rows.append([sync, f"{alone:,.0f} appends/s", f"{grouped:,.0f} appends/s",
                     f"{grouped / alone:.1f}×"])
    print(f"AsyncMemory on SQLite, {args.tasks} tasks, {args.appends} appends per round, "
          f"median of {args.rounds} interleaved rounds\n")
    print(table(["synchronous", "one transaction per append", "group commit", "ratio"], rows))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("pages", help="WAL pages and statements per append, by kind")
    one.add_argument("--length", type=int, default=10_000, help="messages before the appends")
    one.add_argument("--appends", type=int, default=2_000, help="appends counted")
    one.set_defaults(run=pages)
    one = commands.add_parser("group-commit", help="AsyncMemory appends/s, grouped or not")
    one.add_argument("--tasks", type=int, default=32, help="concurrent tasks")
    one.add_argument("--appends", type=int, default=2000, help="appends per round, all tasks")
    one.add_argument("--rounds", type=int, default=5)
    one.set_defaults(run=group_commit)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
