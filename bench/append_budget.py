"""Where a SQLite append's time goes: what each guarantee costs, measured one at a time.

``python bench/append_budget.py [--messages 5000] [--rounds 3] [--checkpoints] [--callgrind]``

Runs the seeded workload (``bench/workload.py``) at ``synchronous=normal``,
one message per append, in one process, these ways interleaved round by round
(a fresh database each):

``floor``, ``statements``
    as in ``bench/sqlite_statements.py``: the raw insert, and flowmem's
    statements on flowmem's schema from plain Python;
``memory``
    flowmem's ``Memory.append`` as shipped;
``key-lock``
    the same with the MEM-12 key lock taken by every append (its thread lock
    and its byte-range lock), as before published holds
    (``flowmem/stores/holds.py``): what reading the holds saves;
``no-file-check``
    without the check after each transaction that refuses to acknowledge a
    write into a deleted or replaced file (the poll of the path's watch, or
    a ``stat``: ``flowmem/stores/sqlite_watch.py``): what that guarantee costs.

The last two run a private store otherwise than flowmem does, to price a
guarantee or a change. Checkpoints are off in every way (``wal_autocheckpoint=0``: on
this machine SQLite's inline checkpoint adds 4–7 µs an append of wall time,
in fsyncs, to each way alike) unless ``--checkpoints``. It prints µs of CPU per
message (median of the rounds; ``--wall``: of wall time, the fsyncs of the
checkpoints included) and each way's difference from ``memory``;
``--callgrind`` prints instructions per message instead (repeatable whatever
the load). Not a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from itertools import islice
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import sqlite_statements
from bench.callgrind import per_item
from bench.workload import DEFAULT_SEED, stream

WAYS = ("floor", "statements", "memory", "key-lock", "no-file-check")
Append = Callable[[int, dict[str, Any]], None]


def _memory(path: str, name: str, checkpoints: bool) -> Append:
    from flowmem import ExecutionContext
    from flowmem.memory import Memory
    from flowmem.stores.sqlite import SQLiteStore

    memory = Memory.from_url(f"sqlite:///{path}?synchronous=normal")
    store = memory.store
    assert isinstance(store, SQLiteStore)
    if not checkpoints:
        store._connection().execute("PRAGMA wal_autocheckpoint=0")
    if name == "key-lock":
        store._locks.holds = None  # no published holds: every append takes its key lock
    if name == "no-file-check":  # the path taken to name the file still, unchecked
        object.__setattr__(store._files, "names", lambda identity: True)
        store._connection()  # this thread's, made now so that its poll can be taken away
        store._local.events = None  # no poll of the watch: the (switched off) stat instead
    context = ExecutionContext(session_id="s")

    def append(index: int, message: dict[str, Any]) -> None:
        memory.append("session", "bench", message, context=context)
    return append


def _way(name: str, path: str, checkpoints: bool) -> Append:
    if name in ("floor", "statements"):  # a checkpoint setting is its connection's own
        append: Append = sqlite_statements._way(name, path, checkpoints)
        return append
    return _memory(path, name, checkpoints)


def run(name: str, messages: list[dict[str, Any]], warmup: int, checkpoints: bool,
        wall: bool = False) -> float:
    """µs of CPU (``wall``: of wall time) per message of one way."""
    with tempfile.TemporaryDirectory() as workdir:
        append = _way(name, f"{workdir}/{name}.db", checkpoints)
        for index, message in enumerate(messages[:warmup]):
            append(index, message)
        clock = time.perf_counter if wall else time.process_time
        return sqlite_statements.cpu_per_message(append, messages, warmup, clock)


def _child(name: str, count: int, generate: int, checkpoints: bool) -> None:
    """One way's ``count`` appends, for callgrind (the workload made as long as the longer
    run's, so that the two runs differ by appends alone)."""
    workload = list(islice(stream(DEFAULT_SEED), max(generate, count)))[:count]
    with tempfile.TemporaryDirectory() as workdir:
        append = _way(name, f"{workdir}/{name}.db", checkpoints)
        for index, message in enumerate(workload):
            append(index, message)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--checkpoints", action="store_true")
    parser.add_argument("--callgrind", action="store_true")
    parser.add_argument("--wall", action="store_true", help="µs of wall time, not of CPU")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--generate", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.messages, args.generate, args.checkpoints)
        return
    if args.callgrind:
        def command(name: str) -> Callable[[int], list[str]]:
            return lambda n: [sys.executable, __file__, "--child", name, "--messages", str(n),
                              "--generate", str(args.warmup + args.messages),
                              *(["--checkpoints"] if args.checkpoints else [])]
        for name in WAYS:
            count = per_item(command(name), args.warmup, args.warmup + args.messages)
            print(f"{name:14} {count:10,.0f} instructions per message", flush=True)
        return
    workload = list(islice(stream(DEFAULT_SEED), args.warmup + args.messages))
    figures: dict[str, list[float]] = {name: [] for name in WAYS}
    for round_ in range(1, args.rounds + 1):
        for name in WAYS:
            figures[name].append(run(name, workload, args.warmup, args.checkpoints,
                                     args.wall))
        print(f"round {round_}: " + "  ".join(f"{name} {values[-1]:.1f}"
                                              for name, values in figures.items()), flush=True)
    medians = {name: statistics.median(values) for name, values in figures.items()}
    print(f"\n{'way':14} {'µs/message':>10} {'vs memory':>10} {'vs floor':>9}")
    for name, value in medians.items():
        print(f"{name:14} {value:10.1f} {value - medians['memory']:+10.1f} "
              f"{value / medians['floor']:8.2f}x")


if __name__ == "__main__":
    main()
