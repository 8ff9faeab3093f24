"""Measure contenders at ONE conversation length, in this process; print one JSON line.

``python -m bench.run_one NAME LENGTH --workdir DIR [--quick]``
    one contender, everything (:mod:`bench.compare` runs it in a fresh
    subprocess per contender and length, so the peak RSS is its own);
``python -m bench.run_one --paired NAME@LENGTH NAME@LENGTH --workdir DIR``
    two trials (two contenders at one length, or one at two lengths), append
    cost only, their windows interleaved (A B, B A, ...) so that both see the
    same disk and CPU weather.

The protocol:

1. Generate the seeded workload prefix and convert it to the contender's
   types, untimed; then reset the RSS peak, so "own RSS" is what the
   contender added on top of the workload it was handed.
2. Prefill conversation ``c0`` to the length (untimed, cheapest correct
   path); a persistent store is closed there and its directory measured.
3. **Short conversations** (length <= 1,000): K-1 more conversations are
   prefilled, so each of the K timed windows (S appends, at most 5 % of the
   length) is measured AT the length; each gets one untimed append first.
   **Long conversations**: one conversation, three untimed appends, then up
   to K windows back to back (at most 5 % drift). The untimed appends size
   the windows: S appends of about 20 ms in all, at most about 20 s in all.
4. Before timing, a persistent store is reopened at its measured
   configuration and warmed up until its WAL is in steady state (:func:`_warm_up`).
5. µs per appended message = the median over the windows of (window time / S).
6. Reads of ``c0``: the full history and the last 50, medians of a few runs.
7. Sendability: append, untimed, the rest of the turn in flight and the next
   user message (the moment a runtime sends the history to a provider), read
   ``c0`` back as OpenAI dicts and count duplicates, dangling calls and
   orphan results (:mod:`bench.sendability`).
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import time
import traceback
from pathlib import Path
from typing import Any

from . import workload
from ._common import proc_value
from .contenders import by_name
from .contenders.base import Contender, dir_bytes
from .sendability import count

SHORT = 1_000
LAST = 50
TIME_BUDGET = 20.0  # seconds of timed appends per long-conversation point


def _status_kb(field: str) -> int | None:
    value = proc_value("/proc/self/status", field + ":")
    return int(value.split()[0]) if value else None


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5", encoding="ascii")
        return True
    except OSError:
        return False


def _repeat(operation: Any, *, at_most: int, budget: float) -> tuple[float, Any]:
    """Median seconds of ``operation()`` over up to ``at_most`` runs within ``budget``."""
    times: list[float] = []
    result = None
    while len(times) < at_most and (not times or sum(times) < budget):
        start = time.perf_counter()
        result = operation()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def _warm_up(store: Contender, workdir: Path, items: list[Any], budget: float) -> dict[str, Any]:
    """Untimed appends to another conversation until the store's files are in steady state.

    A WAL file grows until SQLite's automatic checkpoint (1,000 pages), then is
    reused from its start; while it grows, every fsync also commits the file's
    new size, which can double its cost. A long-running process is past that
    point, so appends go to a warm-up conversation until the WAL has reached
    its working size and stayed there for 50 appends (no WAL: 50 appends).
    """
    started = time.perf_counter()
    last, stable, done = -1, 0, 0
    for item in items:
        store.append("warm-up", item)
        done += 1
        size = sum(path.stat().st_size for path in workdir.glob("*-wal") if path.exists())
        stable = stable + 1 if size == last else 0
        last = size
        settled = size == 0 or size >= 4_000_000
        if (stable >= 50 and settled) or time.perf_counter() - started > budget:
            break
    return {"appends": done, "wal_bytes": max(last, 0),
            "seconds": round(time.perf_counter() - started, 2)}


class Trial:
    """One contender at one length: prepared once, then timed window by window."""

    def __init__(self, name: str, length: int, workdir: Path, *, quick: bool = False,
                 windows: int = 15, max_size: int = 50) -> None:
        self.cls = by_name(name)
        self.length, self.workdir, self.quick = length, workdir, quick
        self.short = length <= SHORT
        self.windows = 5 if quick else windows
        self.size = min(max_size, max(10, length // 20)) if self.short else max_size
        self.out: dict[str, Any] = {"contender": name, "length": length}
        self.per_message: list[float] = []
        self.position = length

    def skip_reason(self) -> tuple[str, str] | None:
        if reason := self.cls.unavailable():
            return "unavailable", reason
        too_long = self.cls.max_length is not None and self.length > self.cls.max_length
        return ("skipped", self.cls.max_length_reason) if too_long else None

    def convert(self) -> None:
        """The workload in the contender's types (untimed)."""
        extra = 1 + self.windows * self.size + 400
        self.messages = workload.conversation(self.length + extra)
        self.store = self.cls()
        self.items = self.store.convert(self.messages)
        warm = workload.conversation(2_000 if self.cls.persistent else 0, workload.DEFAULT_SEED + 1)
        self.warm_items = self.store.convert(warm)

    def prepare(self) -> None:
        """Prefill, measure the disk bytes, reopen, warm up (all untimed)."""
        store, length = self.store, self.length
        self.conversations = [f"c{i}" for i in range(self.windows if self.short else 1)]
        self.directory = self.workdir / "store"
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory.mkdir(parents=True)
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
                                           2.0 if self.quick else 15.0)

    def calibrate(self) -> None:
        """Size the windows from untimed appends: S appends of about 20 ms, within budget
        (short: the first conversation's warm-up append, timed; long: three more appends)."""
        length, timed = self.length, 1 if self.short else 3
        cost = statistics.median(self.store.timed_appends("c0", self.items[i:i + 1])
                                 for i in range(length, length + timed)) / 1e9
        self.size = max(3 if self.short else 1, min(self.size, int(0.02 / max(cost, 1e-9))))
        drift = [] if self.short else [int(0.05 * length / self.size)]  # <= 5 % of the length
        self.windows = max(3, min(self.windows, int(TIME_BUDGET / max(cost * self.size, 1e-9)),
                                  *drift))
        if not self.short:
            self.position = length + timed

    def window(self, index: int) -> float:
        """Time window ``index``; µs per appended message."""
        store, size = self.store, self.size
        if self.short:
            conversation = self.conversations[index]
            if index > 0:
                store.append(conversation, self.items[self.length])  # warm-up, untimed
            start = self.length + 1
            elapsed = store.timed_appends(conversation, self.items[start:start + size])
            if index == 0:
                self.position = start + size
        else:
            elapsed = store.timed_appends("c0", self.items[self.position:self.position + size])
            self.position += size
        self.per_message.append(elapsed / size / 1000)
        return self.per_message[-1]

    def finish_timing(self) -> None:
        self.out["append_windows"] = {"windows": len(self.per_message), "size": self.size,
                                      "us_per_window": [round(x, 3) for x in self.per_message]}
        self.out["us_per_msg"] = statistics.median(self.per_message)

    def reads_and_sendability(self) -> None:
        store, out = self.store, self.out
        full_s, history = _repeat(lambda: store.read_all("c0"), at_most=5, budget=3.0)
        last_s, page = _repeat(lambda: store.read_last("c0", LAST), at_most=9, budget=2.0)
        out.update(appended_before_reads=self.position, stored_before_reads=len(history),
                   read_all_ms=full_s * 1000, read_last50_us=last_s * 1e6,
                   read_last50_count=len(page))
        del history, page
        end = workload.rest_of_turn(self.messages, self.position)
        for item in self.items[self.position:end + 1]:
            store.append("c0", item)  # the turn in flight and the next user message, untimed
        out["sendability"] = count(store.to_openai(store.read_all("c0")))
        out["workload"] = workload.stats(self.messages[:end + 1])


def measure(name: str, length: int, workdir: Path, *, quick: bool = False) -> dict[str, Any]:
    """Everything about one contender at one length (see the module notes)."""
    trial = Trial(name, length, workdir, quick=quick)
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
    trial.reads_and_sendability()
    peak_kb = _status_kb("VmHWM")
    out = trial.out
    out["peak_rss_mb"] = peak_kb / 1024 if peak_kb is not None else None
    out["own_rss_mb"] = ((peak_kb - baseline_kb) / 1024
                         if peak_reset and peak_kb is not None and baseline_kb is not None
                         else None)
    trial.store.close()
    out["elapsed_s"] = time.perf_counter() - started
    out["status"] = "ok"
    return out


def paired(first: str, second: str, workdir: Path, *, quick: bool = False) -> dict[str, Any]:
    """Append cost of two ``name@length`` trials with interleaved windows, and their ratio.

    Two contenders at one length (flowmem against its floor, a peer against
    flowmem) or one contender at two lengths (is its curve flat?).
    """
    specs = [first, second]
    trials = [Trial(name, int(length), workdir / f"{name}-{length}", quick=quick,
                    windows=25, max_size=20)
              for name, _, length in (spec.partition("@") for spec in specs)]
    for trial in trials:
        skip = trial.skip_reason()
        if skip:
            return {"paired": specs, "status": skip[0],
                    "reason": f"{trial.cls.name}: {skip[1]}"}
    for trial in trials:
        trial.convert()
        trial.prepare()
    for trial in trials:
        trial.calibrate()
    windows = min(trial.windows for trial in trials)
    ratios = []
    for index in range(windows):
        order = trials if index % 2 == 0 else trials[::-1]
        values = {id(trial): trial.window(index) for trial in order}
        ratios.append(values[id(trials[0])] / values[id(trials[1])])
    for trial in trials:
        trial.finish_timing()
        trial.store.close()
    return {"paired": specs, "us_per_msg": {spec: trial.out["us_per_msg"]
                                            for spec, trial in zip(specs, trials, strict=True)},
            "ratio_median": statistics.median(ratios), "ratios": [round(r, 3) for r in ratios],
            "windows": windows, "status": "ok"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs=2, help="NAME LENGTH, or with --paired NAME@LENGTH x2")
    parser.add_argument("--paired", action="store_true")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.paired:
            result = paired(*args.names, args.workdir, quick=args.quick)
        else:
            result = measure(args.names[0], int(args.names[1]), args.workdir, quick=args.quick)
    except Exception as exc:
        traceback.print_exc()
        result = {"status": "error", "reason": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
