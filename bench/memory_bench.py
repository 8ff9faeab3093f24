"""Memory benchmark: appends through ``flowmem.Memory`` vs conversation length, and a raw floor.

``python bench/memory_bench.py [--quick] [--lengths 100,10000,100000] [--windows N] [--gc]``

What it measures, in one run:

1. **µs per message and appends/s** through :meth:`flowmem.Memory.append`
   (the full coordinator path: validation, scope resolution, MEM-12 lock,
   the MEM-1/2/3/10 plan, one message per call, ``session`` scope) on
   ``memory://``, ``sqlite://`` with ``synchronous=full`` (the default) and
   ``sqlite://`` with ``synchronous=normal``, at conversation lengths 100,
   10,000 and 100,000. The last row per backend is the ratio of the longest
   length's figure to the shortest's (goal ≤ 1.5: the cost of an append does
   not grow with the conversation).
2. **The raw-sqlite3 floor**, measured in the same run and interleaved with
   flowmem's windows: Python's ``sqlite3``, one ``INSERT`` of the
   ``json.dumps`` text per message, one transaction (``BEGIN`` … ``COMMIT``)
   per append, the same WAL journal and the same ``synchronous``, the same
   messages, the same conversation lengths. Goal: flowmem's SQLite append
   within 2× of it while it does dedup and healing (the floor stores
   re-fired results and unanswered calls as they came).
3. **Reading the last 50 messages** of the 100,000-message conversation
   (``Memory.history(last=50)``; the floor: ``ORDER BY id DESC LIMIT 50``),
   and, for scale, one read of the whole conversation.

Messages are the seeded agent workload of ``bench/workload.py`` (user turns,
assistant turns declaring 1-3 OpenAI-shaped tool calls, their results; ~5 %
re-fired results, ~4 % interrupted turns healed at the next user message,
late results replacing their placeholder). A conversation of length N is
prefilled, untimed, with the first N messages in a few big batched appends;
the timed appends continue the same stream. The timed region is split into
sub-windows of ``--window`` messages; the figure is the median over windows
of (window time / messages). Windows of every (backend, length) pair are
interleaved round by round, so background load hits them alike. The
100-message conversation gets a fresh prefilled conversation per window
(so it stays short); the longer ones grow by the timed messages, which is
printed. GC is paused while timing unless ``--gc``.

Not a test: nothing is asserted. Goals are reported as met or not.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.workload import DEFAULT_SEED, stream
from flowmem import ExecutionContext
from flowmem.memory import Memory

SCOPE = "session"
CONTEXT = ExecutionContext(session_id="memory-bench")
PREFILL_BATCH = 5_000
FRESH_BELOW = 1_000  # conversations shorter than this get a fresh copy per window
READ_LAST = 50

Message = dict[str, Any]


# -- the contenders -----------------------------------------------------------------------


class Contender:
    """One thing that appends: a flowmem backend or the raw floor."""

    name: str
    floor_of: str | None = None

    def prefill(self, key: str, messages: list[Message]) -> None:
        raise NotImplementedError

    def append(self, key: str, message: Message) -> None:
        raise NotImplementedError

    def read_last(self, key: str, n: int) -> list[Any]:
        raise NotImplementedError

    def read_all(self, key: str) -> list[Any]:
        raise NotImplementedError

    def length(self, key: str) -> int:
        return len(self.read_all(key))

    def close(self) -> None:
        pass


class Flowmem(Contender):
    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.url = url
        self.memory = Memory.from_url(url)

    def prefill(self, key: str, messages: list[Message]) -> None:
        for start in range(0, len(messages), PREFILL_BATCH):
            self.memory.append(SCOPE, key, messages[start:start + PREFILL_BATCH],
                               context=CONTEXT)

    def append(self, key: str, message: Message) -> None:
        self.memory.append(SCOPE, key, message, context=CONTEXT)

    def read_last(self, key: str, n: int) -> list[Any]:
        return self.memory.history(SCOPE, key, context=CONTEXT, last=n).messages

    def read_all(self, key: str) -> list[Any]:
        value = self.memory.read(SCOPE, key, context=CONTEXT).value
        return value if isinstance(value, list) else []

    def close(self) -> None:
        self.memory.close()


class RawSQLite(Contender):
    """The floor: one INSERT per message, one transaction per append."""

    def __init__(self, name: str, path: Path, synchronous: str, floor_of: str) -> None:
        self.name = name
        self.floor_of = floor_of
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(f"PRAGMA synchronous={synchronous}")
        self.conn.execute("CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, "
                          "conversation TEXT NOT NULL, body TEXT NOT NULL)")
        self.conn.execute("CREATE INDEX IF NOT EXISTS messages_conversation "
                          "ON messages (conversation, id)")

    def prefill(self, key: str, messages: list[Message]) -> None:
        self.conn.execute("BEGIN")
        self.conn.executemany("INSERT INTO messages (conversation, body) VALUES (?, ?)",
                              [(key, json.dumps(m)) for m in messages])
        self.conn.execute("COMMIT")

    def append(self, key: str, message: Message) -> None:
        execute = self.conn.execute
        execute("BEGIN")
        execute("INSERT INTO messages (conversation, body) VALUES (?, ?)",
                (key, json.dumps(message)))
        execute("COMMIT")

    def read_last(self, key: str, n: int) -> list[Any]:
        rows = self.conn.execute("SELECT body FROM messages WHERE conversation = ? "
                                 "ORDER BY id DESC LIMIT ?", (key, n)).fetchall()
        return [json.loads(row[0]) for row in reversed(rows)]

    def read_all(self, key: str) -> list[Any]:
        return [json.loads(row[0]) for row in self.conn.execute(
            "SELECT body FROM messages WHERE conversation = ? ORDER BY id", (key,))]

    def length(self, key: str) -> int:
        return int(self.conn.execute("SELECT count(*) FROM messages WHERE conversation = ?",
                                     (key,)).fetchone()[0])

    def close(self) -> None:
        self.conn.close()


# -- the run ------------------------------------------------------------------------------


@dataclass
class Series:
    """The timed windows of one (contender, length)."""

    contender: Contender
    length: int
    source: Iterator[Message]
    key: str
    fresh: bool
    per_message: list[float] = field(default_factory=list)  # seconds, one per window
    windows: int = 0


def _prefix(length: int) -> list[Message]:
    return list(islice(stream(DEFAULT_SEED), length))


def _fresh_key(series: Series) -> str:
    return f"len-{series.length}-w{series.windows}"


def run(lengths: list[int], windows: int, window: int, workdir: Path,
        keep_gc: bool, log: Callable[[str], None]) -> dict[str, Any]:
    contenders: list[Contender] = [
        Flowmem("memory://", "memory://"),
        Flowmem("sqlite:// full", f"sqlite:///{workdir / 'full.db'}"),
        Flowmem("sqlite:// normal", f"sqlite:///{workdir / 'normal.db'}?synchronous=normal"),
        RawSQLite("raw sqlite3 WAL+FULL", workdir / "raw-full.db", "FULL", "sqlite:// full"),
        RawSQLite("raw sqlite3 WAL+NORMAL", workdir / "raw-normal.db", "NORMAL",
                  "sqlite:// normal"),
    ]
    prefixes = {length: _prefix(length) for length in lengths}
    series: list[Series] = []
    for contender in contenders:
        for length in lengths:
            fresh = length < FRESH_BELOW
            started = time.perf_counter()
            key = f"len-{length}"
            if not fresh:
                contender.prefill(key, prefixes[length])
            tail = stream(DEFAULT_SEED)
            for _ in islice(tail, length):
                pass
            series.append(Series(contender, length, tail, key, fresh))
            if not fresh:
                log(f"prefilled {contender.name} to {length:,} messages in "
                    f"{time.perf_counter() - started:.1f}s")

    # the timed windows, interleaved round by round
    for round_ in range(windows):
        gc.collect()
        for item in series:
            if item.fresh:  # a new short conversation each window, prefilled untimed
                item.key = _fresh_key(item)
                item.contender.prefill(item.key, prefixes[item.length])
                item.source = stream(DEFAULT_SEED)
                for _ in islice(item.source, item.length):
                    pass
            batch = list(islice(item.source, window))
            append, key = item.contender.append, item.key
            if not keep_gc:
                gc.disable()
            started = time.perf_counter()
            for message in batch:
                append(key, message)
            elapsed = time.perf_counter() - started
            gc.enable()
            item.per_message.append(elapsed / len(batch))
            item.windows += 1
        log(f"round {round_ + 1}/{windows} done")

    # reading the last 50 messages of the longest conversation
    longest = max(lengths)
    reads: dict[str, tuple[float, float, int]] = {}
    for contender in contenders:
        key = next(s.key for s in series if s.contender is contender and s.length == longest)
        samples = []
        for _ in range(31):
            started = time.perf_counter()
            page = contender.read_last(key, READ_LAST)
            samples.append(time.perf_counter() - started)
        assert len(page) == READ_LAST
        started = time.perf_counter()
        whole = contender.read_all(key)
        reads[contender.name] = (statistics.median(samples), time.perf_counter() - started,
                                 len(whole))

    finals = {(s.contender.name, s.length): s.contender.length(s.key) for s in series}
    for contender in contenders:
        contender.close()
    return {"series": series, "reads": reads, "finals": finals, "longest": longest}


# -- the report ---------------------------------------------------------------------------


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f}"


def report(result: dict[str, Any], lengths: list[int], window: int, windows: int) -> str:
    series: list[Series] = result["series"]
    figure = {(s.contender.name, s.length): statistics.median(s.per_message) for s in series}
    spread = {(s.contender.name, s.length): (min(s.per_message), max(s.per_message))
              for s in series}
    names = list(dict.fromkeys(s.contender.name for s in series))
    floors = {s.contender.floor_of: s.contender.name for s in series if s.contender.floor_of}
    lines = [
        f"Appends of one message each, median of {windows} windows of {window} messages "
        "(min–max in brackets).",
        "",
        "| contender | conversation length | µs per message | appends/s | "
        "stored after timing | × raw floor |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        for length in lengths:
            value = figure[(name, length)]
            low, high = spread[(name, length)]
            floor = floors.get(name)
            versus = f"{value / figure[(floor, length)]:.2f}×" if floor else ""
            lines.append(f"| {name} | {length:,} | {_us(value)} ({_us(low)}–{_us(high)}) | "
                         f"{1 / value:,.0f} | {result['finals'][(name, length)]:,} | {versus} |")
        ratio = figure[(name, lengths[-1])] / figure[(name, lengths[0])]
        goal = "goal ≤ 1.5 met" if ratio <= 1.5 else "goal ≤ 1.5 NOT met"
        lines.append(f"| {name} | **ratio {lengths[-1]:,} / {lengths[0]:,}** | "
                     f"**{ratio:.2f}** | | | {goal} |")
    lines += ["", "Goal: flowmem's SQLite append within 2× of the raw floor "
              "(same WAL + synchronous, one transaction per append):", ""]
    for flowmem_name, floor_name in floors.items():
        worst = max(figure[(flowmem_name, n)] / figure[(floor_name, n)] for n in lengths)
        verdict = "met" if worst <= 2.0 else "NOT met"
        lines.append(f"- {flowmem_name} vs {floor_name}: worst {worst:.2f}× — {verdict}")
    longest = result["longest"]
    lines += ["", f"Reading the last {READ_LAST} messages of the {longest:,}-message "
              "conversation (median of 31), and one read of all of it:", "",
              f"| contender | last {READ_LAST}: µs | whole conversation: ms | messages |",
              "|---|---:|---:|---:|"]
    for name, (last, whole, count) in result["reads"].items():
        lines.append(f"| {name} | {_us(last)} | {whole * 1e3:,.1f} | {count:,} |")
    return "\n".join(lines)


def environment() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
            f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, "
            f"load average {load:.1f} at the start")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true",
                        help="fewer, shorter windows (a smoke run, figures are noisier)")
    parser.add_argument("--lengths", default="100,10000,100000",
                        help="conversation lengths, comma-separated (default 100,10000,100000)")
    parser.add_argument("--windows", type=int, default=None,
                        help="timed windows per (contender, length) (default 9, quick 3)")
    parser.add_argument("--window", type=int, default=None,
                        help="messages per window (default 100, quick 40)")
    parser.add_argument("--gc", action="store_true", help="leave the GC on while timing")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the database files go (default: a temporary directory)")
    args = parser.parse_args(argv)
    lengths = sorted(int(n.replace("_", "")) for n in args.lengths.split(","))
    windows = args.windows or (3 if args.quick else 9)
    window = args.window or (40 if args.quick else 100)

    def log(text: str) -> None:
        print(f"  {text}", file=sys.stderr, flush=True)

    print(f"# flowmem memory benchmark\n\n{environment()}\n")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="flowmem-memory-bench-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        result = run(lengths, windows, window, workdir, args.gc, log)
    print(report(result, lengths, window, windows))
    print(f"\n(run took {time.perf_counter() - started:.0f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
