"""CPU µs per appended message through ``Memory.append``, for A/B runs of two trees.

``python bench/append_cpu.py [--messages 5000] [--rounds 5] [--url memory:// ...]
[--python /path/to/venv-a/bin/python --python /path/to/venv-b/bin/python]``

One message per call, ``session`` scope, the seeded workload of
``bench/workload.py`` on a fresh conversation; the figure is the CPU time of
this process (``time.process_time``: other processes' load counts for
little) divided by the messages, GC paused while timing (``--gc``: left on).
Several rounds; the best and the median are printed.

With ``--python`` (given twice or more) the same measurement runs in a child
process of each interpreter in turn, round by round (interleaved), so two
trees — e.g. ``main`` and a branch, each in its own venv — are compared on a
loaded machine by the ratio of their figures. ``--callgrind`` instead runs
each interpreter under ``valgrind --tool=callgrind`` and prints the
instructions per append (repeatable to a fraction of a percent whatever the
load, for a fixed ``PYTHONHASHSEED``: the mean over ``--hash-seeds`` is
printed). Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.callgrind import per_item
from bench.workload import DEFAULT_SEED, stream

URLS = ("memory://", "sqlite:///{dir}/normal.db?synchronous=normal")


def measure(url: str, messages: int, warmup: int, generate: int = 0,
            with_gc: bool = False) -> float:
    """CPU µs per message of ``messages`` one-message appends after ``warmup`` ones.

    ``generate``: how many workload messages to make beforehand (at least enough), so
    that two callgrind runs of different lengths differ by the appends alone.
    """
    from flowmem import ExecutionContext
    from flowmem.memory import Memory

    context = ExecutionContext(session_id="append-cpu")
    batch = list(islice(stream(DEFAULT_SEED), max(generate, warmup + messages)))
    batch = batch[:warmup + messages]
    with tempfile.TemporaryDirectory() as workdir, \
            Memory.from_url(url.format(dir=workdir)) as memory:
        append = memory.append
        for message in batch[:warmup]:
            append("session", "bench", message, context=context)
        timed = batch[warmup:]
        gc.collect()
        if not with_gc:
            gc.disable()
        try:
            start = time.process_time()
            for message in timed:
                append("session", "bench", message, context=context)
            spent = time.process_time() - start
        finally:
            gc.enable()
    return spent / messages * 1e6


def _child(python: str, url: str, messages: int, warmup: int, with_gc: bool) -> float:
    out = subprocess.run([python, __file__, "--child", url, "--messages", str(messages),
                          "--warmup", str(warmup), *(["--gc"] if with_gc else [])],
                         check=True, capture_output=True, text=True,
                         cwd=Path(__file__).parent)
    return float(out.stdout.strip().splitlines()[-1])


def _callgrind(python: str, url: str, messages: int, warmup: int, seed: str) -> float:
    """Instructions per append (:func:`bench.callgrind.per_item`): the run of ``warmup`` + 1
    appends subtracted from the run of ``warmup + messages``."""
    def child(n: int) -> list[str]:
        return [python, __file__, "--child", url, "--messages", str(n), "--warmup", str(warmup),
                "--generate", str(warmup + messages)]
    return per_item(child, 1, messages, seed=seed, cwd=Path(__file__).parent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--url", action="append", help="store URLs ({dir}: a temp dir)")
    parser.add_argument("--python", action="append", help="interpreters to compare")
    parser.add_argument("--callgrind", action="store_true")
    parser.add_argument("--hash-seeds", default="0,1,2",
                        help="PYTHONHASHSEED values of the callgrind runs (comma-separated)")
    parser.add_argument("--gc", action="store_true", help="leave GC on while timing")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--generate", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(measure(args.child, args.messages, args.warmup, args.generate, args.gc))
        return
    urls = args.url or list(URLS)
    pythons = args.python or [sys.executable]
    if args.callgrind:
        for url in urls:
            for python in pythons:
                counts = [_callgrind(python, url, args.messages, args.warmup, seed)
                          for seed in args.hash_seeds.split(",")]
                print(f"{url:45} {python:35} {statistics.mean(counts):9,.0f} instructions/append"
                      f" (seeds: {', '.join(f'{c:,.0f}' for c in counts)})", flush=True)
        return
    figures: dict[tuple[str, str], list[float]] = {(u, p): [] for u in urls for p in pythons}
    for _ in range(args.rounds):
        for url in urls:
            for python in pythons:
                figures[url, python].append(_child(python, url, args.messages, args.warmup,
                                                   args.gc))
    for url in urls:
        base = None
        for python in pythons:
            values = figures[url, python]
            best, median = min(values), statistics.median(values)
            base = base or median
            print(f"{url:45} {python:35} best {best:6.1f}  median {median:6.1f} µs/msg "
                  f"({median / base:.2f}×)  {json.dumps([round(v, 1) for v in values])}")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
