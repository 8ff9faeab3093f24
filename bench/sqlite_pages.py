"""What an SQLite append writes: pages (WAL frames) and statements per append, by kind.

``python bench/sqlite_pages.py [--length 10000] [--appends 2000]``

Counts, not times, so the figures are the same on a loaded machine. A
conversation of the seeded workload is prefilled to ``--length`` messages,
then ``--appends`` more are appended one per call through
:class:`flowmem.Memory` at ``synchronous=normal``, and the same messages
through the raw sqlite3 floor of the comparison (one ``INSERT`` a
transaction). For each append it records the pages the commit wrote to the
WAL (the growth of the ``-wal`` file, checkpoints off) and the statements
run (``sqlite3``'s trace callback), and prints the mean per kind of message:
where the cost of the MEM-1 unique key, the MEM-2 declarations and the MEM-3
pending calls lands. Not a test.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root, not bench/ (see _common)
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.contenders.baselines import RawSQLiteWALNormal
from bench.workload import conversation
from flowmem import ExecutionContext, Memory
from flowmem.messages import Message

FRAME = 4096 + 24  # a WAL frame: one page and its header
CONTEXT = ExecutionContext(session_id="pages-bench")
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--length", type=int, default=10_000)
    parser.add_argument("--appends", type=int, default=2_000)
    args = parser.parse_args(argv)
    messages = conversation(args.length + args.appends)
    prefix, timed = messages[:args.length], messages[args.length:]
    with tempfile.TemporaryDirectory(prefix="flowmem-pages-") as tmp:
        ours, floor = (side(Path(tmp), prefix, timed) for side in (flowmem_side, floor_side))
    print(f"Pages written and statements run per append at {args.length:,} messages "
          f"({args.appends:,} appends, synchronous=normal)\n")
    print("| message | appends | flowmem pages | floor pages | flowmem statements "
          "| floor statements |\n|---|---:|---:|---:|---:|---:|")
    for name in sorted(ours):
        (pages, statements, n), (floor_pages, floor_statements, _) = ours[name], floor[name]
        print(f"| {name} | {n:,} | {pages:.2f} | {floor_pages:.2f} | {statements:.2f} "
              f"| {floor_statements:.2f} |")
    count = sum(n for _, _, n in ours.values())
    total = [sum(side[k][i] * side[k][2] for k in side) / count
             for i, side in ((0, ours), (0, floor), (1, ours), (1, floor))]
    print(f"| **all** | {count:,} | **{total[0]:.2f}** | **{total[1]:.2f}** "
          f"| **{total[2]:.2f}** | **{total[3]:.2f}** |")


if __name__ == "__main__":
    main()
