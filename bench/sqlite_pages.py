"""What an SQLite append writes: pages (WAL frames) and statements per append, by kind.

``python bench/sqlite_pages.py [--length 10000] [--appends 2000]``

Counts, not times, so the figures are the same on a loaded machine. A
conversation of the seeded workload (``bench/workload.py``) is prefilled to
``--length`` messages, then ``--appends`` more are appended one per call
through :class:`flowmem.Memory` at ``synchronous=normal``, and the same
messages through the raw floor of ``bench/memory_bench.py`` (one ``INSERT``
per transaction). For each append it records how many pages the commit
wrote to the WAL (the growth of the ``-wal`` file, checkpoints off) and
how many statements ran (``sqlite3``'s trace callback), and prints the mean
per kind of message. Each page is one more write a commit makes; that is
where the cost of the MEM-1 unique key, the MEM-2 declarations and the
MEM-3 pending calls lands. Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable
from itertools import islice
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.workload import DEFAULT_SEED, stream
from flowmem import ExecutionContext, Memory
from flowmem.messages import Message

FRAME = 4096 + 24  # a WAL frame: one page and its header
CONTEXT = ExecutionContext(session_id="pages-bench")


def kind(message: Message) -> str:
    if message["role"] == "assistant" and message.get("tool_calls"):
        return "assistant declaring calls"
    return str(message["role"])


def measure(conn: sqlite3.Connection, wal: str, append: Callable[[Message], None],
            messages: list[Message]) -> dict[str, tuple[float, float, int]]:
    """Pages and statements per append, by kind: ``{kind: (pages, statements, n)}``."""
    statements = [0]
    conn.set_trace_callback(lambda _sql: statements.__setitem__(0, statements[0] + 1))
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for message in messages:
        before, statements[0] = os.path.getsize(wal), 0
        append(message)
        row = sums[kind(message)]
        row[0] += (os.path.getsize(wal) - before) / FRAME
        row[1] += statements[0]
        row[2] += 1
    conn.set_trace_callback(None)
    return {k: (v[0] / v[2], v[1] / v[2], int(v[2])) for k, v in sums.items()}


def flowmem_side(workdir: Path, prefix: list[Message],
                 timed: list[Message]) -> dict[str, tuple[float, float, int]]:
    path = workdir / "flowmem.db"
    memory = Memory.from_url(f"sqlite:///{path}?synchronous=normal")
    for start in range(0, len(prefix), 500):
        memory.append("session", "chat", prefix[start:start + 500], context=CONTEXT)
    conn = memory.store._connection()  # type: ignore[attr-defined]
    result = measure(conn, f"{path}-wal",
                     lambda m: memory.append("session", "chat", m, context=CONTEXT), timed)
    memory.close()
    return result


def floor_side(workdir: Path, prefix: list[Message],
               timed: list[Message]) -> dict[str, tuple[float, float, int]]:
    path = workdir / "floor.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, "
                 "conversation TEXT NOT NULL, body TEXT NOT NULL)")
    conn.execute("CREATE INDEX messages_conversation ON messages (conversation, id)")
    insert = "INSERT INTO messages (conversation, body) VALUES (?, ?)"
    conn.executemany(insert, [("chat", json.dumps(m)) for m in prefix])

    def append(message: Message) -> None:
        conn.execute("BEGIN")
        conn.execute(insert, ("chat", json.dumps(message)))
        conn.execute("COMMIT")

    result = measure(conn, f"{path}-wal", append, timed)
    conn.close()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--length", type=int, default=10_000)
    parser.add_argument("--appends", type=int, default=2_000)
    args = parser.parse_args(argv)
    messages = list(islice(stream(DEFAULT_SEED), args.length + args.appends))
    prefix, timed = messages[:args.length], messages[args.length:]
    with tempfile.TemporaryDirectory(prefix="flowmem-pages-") as tmp:
        ours = flowmem_side(Path(tmp), prefix, timed)
        floor = floor_side(Path(tmp), prefix, timed)
    print(f"Pages written and statements run per append at {args.length:,} messages "
          f"({args.appends:,} appends, synchronous=normal)\n")
    print("| message | appends | flowmem pages | floor pages | flowmem statements "
          "| floor statements |\n|---|---:|---:|---:|---:|---:|")
    total = [0.0, 0.0, 0.0, 0.0]
    for name in sorted(ours):
        pages, statements, n = ours[name]
        floor_pages, floor_statements, _ = floor[name]
        print(f"| {name} | {n:,} | {pages:.2f} | {floor_pages:.2f} | {statements:.2f} "
              f"| {floor_statements:.2f} |")
        for i, value in enumerate((pages * n, floor_pages * n, statements * n,
                                   floor_statements * n)):
            total[i] += value
    count = sum(n for _, _, n in ours.values())
    print(f"| **all** | {count:,} | **{total[0] / count:.2f}** | **{total[1] / count:.2f}** "
          f"| **{total[2] / count:.2f}** | **{total[3] / count:.2f}** |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
