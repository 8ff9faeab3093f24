"""Measure contenders at ONE conversation length, in this process; print one JSON line.

``python -m bench.run_one NAME LENGTH --workdir DIR [--quick]``
    one contender, everything (run by :mod:`bench.compare` in a fresh
    subprocess per contender and length, so the peak RSS is its own);
``python -m bench.run_one --paired NAME@LENGTH NAME@LENGTH --workdir DIR``
    two trials (two contenders at one length, or one contender at two
    lengths), append cost only, their windows interleaved (A B, B A, ...) so
    that both see the same disk and CPU weather: the ratios for the
    matched-durability and flat-curve goals on a shared machine.

The protocol:

1. Generate the workload prefix (seeded, identical for everyone) and convert
   it to the contender's message types. Nothing so far is timed; the RSS
   peak is then reset (``/proc/self/clear_refs``), so "own RSS" is what the
   contender added on top of the workload it was handed.
2. Prefill conversation ``c0`` to the length (untimed, cheapest correct
   path); a persistent store is closed there and its directory measured:
   the disk bytes of one conversation of that length.
3. **Short conversations** (length <= 1,000): K-1 more conversations are
   prefilled to the length in the same store, so each of the K timed
   windows (S appends, at most 5 % of the length) is measured AT the length,
   not after drifting past it; each conversation gets one untimed append
   first. **Long conversations**: one
   conversation, three untimed appends, then up to K windows back to back
   (at most 5 % drift). Either way the untimed appends size the windows: S
   appends of about 20 ms in all (at least 3 for short, 1 for long
   conversations, at most 50), and at most about 20 s of timed appends.
4. Before timing, a persistent store is reopened at its measured
   configuration and warmed up on another conversation until its WAL file
   is in steady state (see :func:`_warm_up`).
5. µs per appended message = the median over the windows of (window time
   / S).
6. Reads of ``c0``: the full history and the last 50, medians of a few runs.
7. Sendability: append, untimed, the rest of the turn in flight and the
   next user message — the moment a runtime sends the history to a
   provider — then read ``c0`` back, convert it to OpenAI dicts and count
   duplicates, dangling calls and orphan results (:mod:`bench.sendability`).
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from . import workload
from .contenders import by_name
from .contenders.base import Contender, dir_bytes
from .sendability import count

SHORT = 1_000
LAST = 50
WINDOWS = 15
PAIRED_WINDOWS = 25
QUICK_WINDOWS = 5
TIME_BUDGET = 20.0  # seconds of timed appends per long-conversation point


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


def _repeat(operation: Any, *, at_most: int, budget: float) -> tuple[float, Any]:
    """Median seconds of ``operation()`` over up to ``at_most`` runs within ``budget``."""
    times: list[float] = []
    result = None
    spent = 0.0
    while len(times) < at_most and (not times or spent < budget):
        start = time.perf_counter()
        result = operation()
        elapsed = time.perf_counter() - start
        times.append(elapsed)
        spent += elapsed
    return statistics.median(times), result


def _wal_bytes(workdir: Path) -> int:
    return sum(path.stat().st_size for path in workdir.glob("*-wal") if path.exists())


def _warm_up(store: Contender, workdir: Path, items: list[Any], *,
             budget: float = 15.0) -> dict[str, Any]:
    """Untimed appends to another conversation until the store's files are in steady state.

    A WAL file grows until SQLite's automatic checkpoint (1,000 pages), then is
    reused from its start; while it grows, every fsync also commits the file's
    new size, which can double its cost. A long-running process is past that
    point, so every persistent contender is brought there before timing:
    appends go to a warm-up conversation until the WAL has reached its working
    size and stayed there for 50 appends (a store without a WAL: 50 appends).
    """
    started = time.perf_counter()
    last, stable, done = -1, 0, 0
    for item in items:
        store.append("warm-up", item)
        done += 1
        size = _wal_bytes(workdir)
        stable = stable + 1 if size == last else 0
        last = size
        settled = size == 0 or size >= 4_000_000
        if (stable >= 50 and settled) or time.perf_counter() - started > budget:
            break
    return {"appends": done, "wal_bytes": max(last, 0),
            "seconds": round(time.perf_counter() - started, 2)}


def _fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


class Trial:
    """One contender at one length: prepared once, then timed window by window."""

    def __init__(self, name: str, length: int, workdir: Path, *, quick: bool = False,
                 seed: int = workload.DEFAULT_SEED, windows: int = WINDOWS,
                 max_size: int = 50) -> None:
        self.cls = by_name(name)
        self.length = length
        self.workdir = workdir
        self.short = length <= SHORT
        self.windows = QUICK_WINDOWS if quick else windows
        self.max_size = max_size
        self.size = min(max_size, max(10, length // 20)) if self.short else max_size
        self.seed = seed
        self.quick = quick
        self.out: dict[str, Any] = {"contender": name, "length": length}
        self.per_message: list[float] = []
        self.position = length
        self.writes_before: dict[str, int] | None = None

    def skip_reason(self) -> tuple[str, str] | None:
        reason = self.cls.unavailable()
        if reason:
            return "unavailable", reason
        if self.cls.max_length is not None and self.length > self.cls.max_length:
            return "skipped", self.cls.max_length_reason
        return None

    def convert(self) -> None:
        """The workload in the contender's types (untimed)."""
        extra = 1 + self.windows * self.size + 400
        self.messages = workload.conversation(self.length + extra, self.seed)
        self.store = self.cls()
        self.items = self.store.convert(self.messages)
        warm = workload.conversation(2_000 if self.cls.persistent else 0, self.seed + 1)
        self.warm_items = self.store.convert(warm)

    def prepare(self) -> None:
        """Prefill, measure the disk bytes, reopen, warm up (all untimed)."""
        store, length = self.store, self.length
        self.conversations = [f"c{i}" for i in range(self.windows if self.short else 1)]
        self.directory = _fresh(self.workdir / "store")
        store.open(self.directory, bulk=True)
        store.prefill("c0", self.items[:length])
        if self.cls.persistent:
            store.close()
            self.out["disk_bytes"] = dir_bytes(self.directory)
            store.open(self.directory, bulk=True)
        for conversation in self.conversations[1:]:
            store.prefill(conversation, self.items[:length])
        if self.cls.persistent:
            store.close()
            store.open(self.directory)
            self.out["warm_up"] = _warm_up(store, self.directory, self.warm_items,
                                           budget=2.0 if self.quick else 15.0)
        self.writes = getattr(store, "write_stats", None)

    def calibrate(self) -> None:
        """Size the windows from untimed appends: S appends of about 20 ms, within budget."""
        store, length = self.store, self.length
        if self.short:
            # the first conversation's warm-up append, timed only to size the windows
            cost = store.timed_appends("c0", self.items[length:length + 1]) / 1e9
            self.size = max(3, min(self.size, int(0.02 / max(cost, 1e-9))))
            self.windows = max(3, min(self.windows, int(TIME_BUDGET / max(cost * self.size,
                                                                           1e-9))))
            return
        warm = [store.timed_appends("c0", self.items[length + i:length + i + 1])
                for i in range(3)]
        self.position = length + 3
        cost = statistics.median(warm) / 1e9
        self.size = max(1, min(self.max_size, int(0.02 / max(cost, 1e-9))))
        by_time = int(TIME_BUDGET / max(cost * self.size, 1e-9))
        by_drift = int(0.05 * length / self.size)
        self.windows = max(3, min(self.windows, by_time, by_drift))
        if self.writes:
            self.writes_before = self.writes("c0")

    def window(self, index: int) -> float:
        """Time window ``index``; µs per appended message."""
        store, size = self.store, self.size
        if self.short:
            conversation = self.conversations[index]
            if index > 0:
                store.append(conversation, self.items[self.length])  # warm-up, untimed
            if index == 0 and self.writes:
                self.writes_before = self.writes("c0")
            start = self.length + 1
            elapsed = store.timed_appends(conversation, self.items[start:start + size])
            if index == 0:
                self.position = start + size
                self._write_stats(size)
        else:
            elapsed = store.timed_appends("c0", self.items[self.position:self.position + size])
            self.position += size
        value = elapsed / size / 1000
        self.per_message.append(value)
        return value

    def _write_stats(self, appends: int) -> None:
        if not self.writes or self.writes_before is None:
            return
        before, after = self.writes_before, self.writes("c0")
        grown = (after["checkpoint_bytes"] - before["checkpoint_bytes"]
                 + after["write_bytes"] - before["write_bytes"])
        self.out["write_stats"] = {
            "checkpoints_per_append": (after["checkpoints"] - before["checkpoints"]) / appends,
            "bytes_per_append": grown / appends,
            "last_checkpoint_bytes": after["last_checkpoint_bytes"],
        }
        if "disk_bytes" in self.out:
            # A conversation built one invoke per message: an invoke writes bytes that grow
            # linearly with the length, so about half of today's, N times.
            self.out["disk_bytes_if_built_per_message"] = int(grown / appends
                                                              * self.length / 2)

    def finish_timing(self) -> None:
        if not self.short:
            self._write_stats(self.windows * self.size)
        self.out["append_windows"] = {"windows": len(self.per_message), "size": self.size,
                                      "us_per_window": [round(x, 3) for x in self.per_message]}
        self.out["us_per_msg"] = statistics.median(self.per_message)

    def reads_and_sendability(self) -> None:
        store, out = self.store, self.out
        full_s, history = _repeat(lambda: store.read_all("c0"), at_most=5, budget=3.0)
        last_s, page = _repeat(lambda: store.read_last("c0", LAST), at_most=9, budget=2.0)
        out["appended_before_reads"] = self.position
        out["stored_before_reads"] = len(history)
        out["read_all_ms"] = full_s * 1000
        out["read_last50_us"] = last_s * 1e6
        out["read_last50_count"] = len(page)
        del history, page
        end = workload.rest_of_turn(self.messages, self.position)
        for item in self.items[self.position:end + 1]:
            store.append("c0", item)  # the turn in flight and the next user message, untimed
        out["sendability"] = count(store.to_openai(store.read_all("c0"))).to_dict()
        out["workload"] = vars(workload.stats(self.messages[:end + 1]))

    def close(self) -> None:
        self.store.close()


def measure(name: str, length: int, workdir: Path, *, quick: bool = False,
            seed: int = workload.DEFAULT_SEED) -> dict[str, Any]:
    """Everything about one contender at one length (see the module notes)."""
    trial = Trial(name, length, workdir, quick=quick, seed=seed)
    skip = trial.skip_reason()
    if skip:
        return {**trial.out, "status": skip[0], "reason": skip[1]}
    started = time.perf_counter()
    trial.convert()
    gc.collect()
    baseline_kb = _status_kb("VmRSS")
    peak_reset = _reset_peak()
    trial.prepare()
    trial.calibrate()
    for index in range(trial.windows):
        trial.window(index)
    trial.finish_timing()
    out = trial.out
    appending_kb = _status_kb("VmHWM")
    if peak_reset and appending_kb is not None and baseline_kb is not None:
        out["own_rss_append_mb"] = (appending_kb - baseline_kb) / 1024
    trial.reads_and_sendability()
    peak_kb = _status_kb("VmHWM")
    out["peak_rss_mb"] = peak_kb / 1024 if peak_kb is not None else None
    out["own_rss_mb"] = ((peak_kb - baseline_kb) / 1024
                         if peak_reset and peak_kb is not None and baseline_kb is not None
                         else None)
    trial.close()
    out["elapsed_s"] = time.perf_counter() - started
    out["status"] = "ok"
    return out


def paired(first: str, second: str, workdir: Path, *, quick: bool = False,
           seed: int = workload.DEFAULT_SEED) -> dict[str, Any]:
    """Append cost of two ``name@length`` trials with interleaved windows, and their ratio.

    The two may be two contenders at one length (flowmem against its floor, a
    peer against flowmem) or one contender at two lengths (is its curve flat?).
    """
    specs = [first, second]
    out: dict[str, Any] = {"paired": specs}
    trials = []
    for spec in specs:
        name, _, length = spec.partition("@")
        trials.append(Trial(name, int(length), workdir / spec.replace("@", "-"), quick=quick,
                            seed=seed, windows=PAIRED_WINDOWS, max_size=20))
    for trial in trials:
        skip = trial.skip_reason()
        if skip:
            return {**out, "status": skip[0], "reason": f"{trial.cls.name}: {skip[1]}"}
    for trial in trials:
        trial.convert()
        trial.prepare()
    for trial in trials:
        trial.calibrate()
    windows = min(trial.windows for trial in trials)
    ratios = []
    for index in range(windows):
        order = list(zip(specs, trials, strict=True))
        values = {spec: trial.window(index) for spec, trial in
                  (order if index % 2 == 0 else order[::-1])}
        ratios.append(values[first] / values[second])
    for trial in trials:
        trial.finish_timing()
        trial.close()
    out["us_per_msg"] = {spec: trial.out["us_per_msg"]
                         for spec, trial in zip(specs, trials, strict=True)}
    out["ratio_median"] = statistics.median(ratios)
    out["ratios"] = [round(r, 3) for r in ratios]
    out["windows"] = windows
    out["status"] = "ok"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+",
                        help="NAME LENGTH, or with --paired NAME@LENGTH NAME@LENGTH")
    parser.add_argument("--paired", action="store_true")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=workload.DEFAULT_SEED)
    args = parser.parse_args(argv)
    if len(args.names) != 2:
        parser.error("expected NAME LENGTH, or --paired NAME@LENGTH NAME@LENGTH")
    try:
        if args.paired:
            result = paired(args.names[0], args.names[1], args.workdir, quick=args.quick,
                            seed=args.seed)
        else:
            result = measure(args.names[0], int(args.names[1]), args.workdir,
                             quick=args.quick, seed=args.seed)
    except Exception as exc:
        traceback.print_exc()
        result = {"names": args.names, "paired": args.names if args.paired else None,
                  "status": "error", "reason": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
