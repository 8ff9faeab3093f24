"""What flowmem's SQLite statements cost without flowmem: the budget left for its Python.

``python bench/sqlite_statements.py [--messages 3000] [--rounds 3] [--callgrind]``

Runs the seeded workload (``bench/workload.py``) at ``synchronous=normal``,
one message per transaction, four ways in one process, interleaved:

``floor``
    the raw floor of ``bench.compare``: ``BEGIN``, one ``INSERT``, ``COMMIT``;
``statements``
    the statements flowmem's common SQLite append runs, on flowmem's schema
    (schema 7: the clustered ``messages`` table, the MEM-1 results index, the
    conversation's state on its newest entry), from plain Python:
    ``BEGIN IMMEDIATE``, ``PRAGMA data_version``, the ``INSERT`` carrying the
    state, ``COMMIT`` — no validation, no plan;
``row``
    the same on schema 6, where the state was the conversation's row in
    ``buffers`` (and its version trigger): the ``INSERT``, then the row's
    ``UPDATE`` — one statement and one b-tree page more per commit;
``guarded``
    the same ``INSERT`` with a hot copy's check in it (its position ``NULL``, so
    refused, unless the conversation's state is at the version the copy knows),
    in place of ``PRAGMA data_version``: tried for the eighth pass of #14;
``one``
    that guarded ``INSERT`` alone, in autocommit mode (it takes the write lock
    at its start and commits at its end): the common append as ONE statement,
    the lever docs/benchmarks-hotpath.md prices for a next pass;
``memory``
    flowmem's own ``Memory.append``.

It prints µs per message (CPU time of this process) and the pages each commit
wrote (the WAL's growth, checkpoints off). ``--callgrind`` instead prints the
instructions per message of each way (``valgrind``, repeatable whatever the
load). The gap between ``statements`` and ``floor`` is what the schema costs;
the gap between ``memory`` and ``statements`` is flowmem's Python. Not a test.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from itertools import islice
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.callgrind import per_item
from bench.workload import DEFAULT_SEED, stream

WAYS = ("floor", "statements", "row", "guarded", "one", "memory")
_SCHEMA = (
    "CREATE TABLE buffers (id INTEGER PRIMARY KEY, scope TEXT, scope_id TEXT, key TEXT, "
    "count INTEGER, next_pos INTEGER, pending TEXT, version INTEGER, "
    "UNIQUE (scope, scope_id, key))",
    "CREATE TABLE messages (buffer_id INTEGER NOT NULL, pos INTEGER NOT NULL, "
    "role TEXT NOT NULL, result_id TEXT, healed INTEGER NOT NULL DEFAULT 0, "
    "body TEXT NOT NULL, head_count INTEGER, head_next INTEGER, head_pending TEXT, "
    "head_version INTEGER, PRIMARY KEY (buffer_id, pos)) WITHOUT ROWID",
    "CREATE UNIQUE INDEX messages_result ON messages (buffer_id, result_id) "
    "WHERE result_id IS NOT NULL",
    "CREATE TRIGGER buffers_version AFTER UPDATE ON buffers WHEN NEW.version = OLD.version "
    "BEGIN UPDATE buffers SET version = random() WHERE id = NEW.id; END",
    "INSERT INTO buffers VALUES (1, 'session', 's', 'bench', 0, 0, '{}', 0)",
)


def _connect(path: str, checkpoints: bool = False) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    # off: pages are counted from the WAL's growth; on: SQLite's default, per connection
    conn.execute(f"PRAGMA wal_autocheckpoint={1000 if checkpoints else 0}")
    return conn


def _floor(path: str, checkpoints: bool = False) -> Any:
    conn = _connect(path, checkpoints)
    conn.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, conversation TEXT NOT NULL, "
                 "body TEXT NOT NULL)")
    conn.execute("CREATE INDEX messages_conversation ON messages (conversation, id)")
    execute = conn.execute

    def append(index: int, message: dict[str, Any]) -> None:
        execute("BEGIN")
        execute("INSERT INTO messages (conversation, body) VALUES (?, ?)",
                ("bench", json.dumps(message)))
        execute("COMMIT")
    return append


_WITH_HEAD = ("INSERT INTO messages (buffer_id, pos, role, result_id, healed, body, "
              "head_count, head_next, head_pending, head_version) ")
_GUARDED = (_WITH_HEAD + "VALUES (?, CASE WHEN coalesce((SELECT head_version FROM messages "
            "WHERE buffer_id = ? ORDER BY pos DESC LIMIT 1), (SELECT version FROM buffers "
            "WHERE id = ?)) = ? THEN ? END, ?, ?, 0, ?, ?, ?, '{}', ?)")


def _guarded(path: str, alone: bool) -> Any:
    conn = _connect(path)
    for statement in _SCHEMA:
        conn.execute(statement)
    execute = conn.cursor().execute
    known = [0]  # the version the copy knows: the buffer row's, then each append's

    def append(index: int, message: dict[str, Any]) -> None:
        answered = message.get("tool_call_id")
        result = f"{answered}/{index}" if answered else None
        pos = index << 20
        version = random.getrandbits(62)
        params = (1, 1, 1, known[0], pos, message["role"], result, json.dumps(message),
                  index + 1, pos + (1 << 20), version)
        if alone:
            execute(_GUARDED, params)
        else:
            execute("BEGIN IMMEDIATE")
            execute(_GUARDED, params)
            execute("COMMIT")
        known[0] = version
    return append


def _statements(path: str, row: bool, checkpoints: bool = False) -> Any:
    conn = _connect(path, checkpoints)
    for statement in _SCHEMA:
        conn.execute(statement)
    execute = conn.cursor().execute

    def append(index: int, message: dict[str, Any]) -> None:
        answered = message.get("tool_call_id")
        result = f"{answered}/{index}" if answered else None  # unique: no MEM-1 refusal here
        pos = index << 20
        entry = (1, pos, message["role"], result, json.dumps(message))
        version = random.getrandbits(62)
        execute("BEGIN IMMEDIATE")
        execute("PRAGMA data_version").fetchone()
        if row:
            execute("INSERT INTO messages (buffer_id, pos, role, result_id, healed, body) "
                    "VALUES (?, ?, ?, ?, 0, ?)", entry)
            execute("UPDATE buffers SET count = ?, next_pos = ?, version = ? WHERE id = ?",
                    (index + 1, pos + (1 << 20), version, 1))
        else:
            execute(_WITH_HEAD + "VALUES (?, ?, ?, ?, 0, ?, ?, ?, '{}', ?)",
                    (*entry, index + 1, pos + (1 << 20), version))
        execute("COMMIT")
    return append


def _memory(path: str) -> Any:
    from flowmem import ExecutionContext
    from flowmem.memory import Memory

    memory = Memory.from_url(f"sqlite:///{path}?synchronous=normal")
    context = ExecutionContext(session_id="s")

    def append(index: int, message: dict[str, Any]) -> None:
        memory.append("session", "bench", message, context=context)
    return append


def _way(name: str, path: str, checkpoints: bool = False) -> Any:
    """One way's append; ``checkpoints``: SQLite's automatic checkpoints on (the floor
    and the statements; off everywhere else)."""
    if name == "floor":
        return _floor(path, checkpoints)
    if name == "memory":
        return _memory(path)
    if name in ("guarded", "one"):
        return _guarded(path, alone=name == "one")
    return _statements(path, row=name == "row", checkpoints=checkpoints)


def run(name: str, messages: list[dict[str, Any]], warmup: int) -> tuple[float, float]:
    """µs of CPU per message and WAL pages per commit of one way."""
    with tempfile.TemporaryDirectory() as workdir:
        path = f"{workdir}/{name}.db"
        append = _way(name, path)
        for index, message in enumerate(messages[:warmup]):
            append(index, message)
        wal = Path(path + "-wal")
        before = wal.stat().st_size if wal.exists() else 0
        spent = cpu_per_message(append, messages, warmup)
        timed = len(messages) - warmup
        pages = (wal.stat().st_size - before) / (4096 + 24) / timed if name != "memory" else 0.0
        return spent, pages


def cpu_per_message(append: Any, messages: list[dict[str, Any]], warmup: int,
                    clock: Callable[[], float] = time.process_time) -> float:
    """µs of CPU per message of ``append`` over ``messages[warmup:]`` (the collector off);
    of wall time with ``clock=time.perf_counter``."""
    gc.collect()
    gc.disable()
    try:
        start = clock()
        for index, message in enumerate(messages[warmup:], warmup):
            append(index, message)
        spent = clock() - start
    finally:
        gc.enable()
    return spent / (len(messages) - warmup) * 1e6


def _instructions(name: str, messages: int, warmup: int) -> float:
    def child(n: int) -> list[str]:
        return [sys.executable, __file__, "--child", name, "--messages", str(warmup + n),
                "--generate", str(warmup + messages)]
    return per_item(child, 1, messages)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--callgrind", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--generate", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # one way's appends, for callgrind
        # as many made as the longer run appends, so the two runs differ by appends alone
        workload = list(islice(stream(DEFAULT_SEED), max(args.generate, args.messages)))
        workload = workload[:args.messages]
        with tempfile.TemporaryDirectory() as workdir:
            append = _way(args.child, f"{workdir}/{args.child}.db")
            for index, message in enumerate(workload):
                append(index, message)
        return
    if args.callgrind:
        for name in WAYS:
            count = _instructions(name, args.messages, args.warmup)
            print(f"{name:11} {count:10,.0f} instructions per message", flush=True)
        return
    workload = list(islice(stream(DEFAULT_SEED), args.warmup + args.messages))
    for round_ in range(1, args.rounds + 1):
        figures = {name: run(name, workload, args.warmup) for name in WAYS}
        print(f"round {round_}: " + "  ".join(
            f"{name} {us:5.1f} µs" + (f" ({pages:.2f} pages)" if pages else "")
            for name, (us, pages) in figures.items()), flush=True)


if __name__ == "__main__":
    main()
