"""Scale benchmark: appends/s under concurrency, and cost per message vs conversation length.

``python bench/scale.py [--backends sqlite,postgres,redis] [--writers 1,4,16]
[--modes threads,processes] [--seconds 3] [--lengths 100,10000]``

For every backend that opens (SQLite always, in a temp directory with the
default ``synchronous=full``; PostgreSQL at ``--postgres`` in a throw-away
schema; Redis at ``--redis`` when its store module and server are there —
each detected at run time through ``open_store``), in one run:

1. **appends/s** through :class:`flowmem.Memory` (the full MEM-1..14 path, one
   workload message per ``append``) on ONE hot buffer that every writer
   appends to, and on 64 buffers shared out among the writers, with 1, 4 and
   16 concurrent writers, for ``--seconds`` each. ``threads``: the writers
   are threads sharing one ``Memory``; ``processes``: each writer is a
   ``spawn``-ed process with its own ``Memory`` (what N flowmem workers do;
   free of the GIL).
2. **µs per message** at conversation lengths 100 and 10,000: conversations
   are built to the length in batches, then single-message appends are timed
   (10 conversations x 20 appends at 100, 1 x 200 at 10,000) — the ratio
   says whether the cost grows with the conversation (goal ≤ 1.5).

Messages come from the seeded agent workload (``bench/workload.py``: tool
calls, re-fired and late results, interrupted turns). Prints markdown tables.
Not a test.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from itertools import islice
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

try:
    from bench.workload import stream
except ImportError:  # run as ``python bench/scale.py``: this folder leads sys.path
    from workload import stream  # type: ignore[no-redef]

from flowmem import ExecutionContext
from flowmem.errors import FlowmemError
from flowmem.memory import Memory
from flowmem.stores import open_store

SCOPE = "session"
BUFFERS = 64
BENCH_SCHEMA = "flowmem_bench"


def _with(url: str, **options: Any) -> str:
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    query.update({k: str(v) for k, v in options.items()})
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), ""))


# -- one writer --------------------------------------------------------------------------
def _plan(writer: int, writers: int, layout: str) -> list[tuple[str, int]]:
    """The (key, seed) pairs a writer appends to, in turn."""
    if layout == "hot":
        return [("hot", 1000 + writer)]
    return [(f"b{b}", 2000 + b) for b in range(BUFFERS) if b % writers == writer]


def _write(memory: Memory, session: str, writer: int, writers: int, layout: str,
           stop_at: float) -> int:
    context = ExecutionContext(session_id=session)
    targets = [(key, stream(seed)) for key, seed in _plan(writer, writers, layout)]
    done = 0
    while time.perf_counter() < stop_at:
        key, messages = targets[done % len(targets)]
        memory.append(SCOPE, key, next(messages), context=context)
        done += 1
    return done


def _process_writer(url: str, session: str, writer: int, writers: int, layout: str,
                    seconds: float, barrier: Any, results: Any) -> None:
    memory = Memory.from_url(url)
    try:
        memory.read(SCOPE, "warm-up", context=ExecutionContext(session_id=session))
        barrier.wait()
        results.put(_write(memory, session, writer, writers, layout,
                           time.perf_counter() + seconds))
    finally:
        memory.close()


def throughput(url: str, writers: int, layout: str, mode: str, seconds: float) -> float:
    """Appends/s of ``writers`` concurrent writers over ``seconds``."""
    session = f"bench-{uuid.uuid4().hex}"
    if mode == "threads":
        memory = Memory.from_url(url)
        counts = [0] * writers
        start = threading.Barrier(writers + 1)

        def run(w: int) -> None:
            start.wait()
            counts[w] = _write(memory, session, w, writers, layout, stop_at["t"])

        stop_at = {"t": 0.0}
        memory.read(SCOPE, "warm-up", context=ExecutionContext(session_id=session))
        threads = [threading.Thread(target=run, args=(w,)) for w in range(writers)]
        for thread in threads:
            thread.start()
        began = time.perf_counter()
        stop_at["t"] = began + seconds
        start.wait()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - began
        _cleanup(memory, session, layout)
        memory.close()
        return sum(counts) / elapsed
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(writers), ctx.Queue()
    procs = [ctx.Process(target=_process_writer,
                         args=(url, session, w, writers, layout, seconds, barrier, results))
             for w in range(writers)]
    for proc in procs:
        proc.start()
    total = sum(results.get(timeout=300) for _ in procs)
    for proc in procs:
        proc.join(60)
    memory = Memory.from_url(url)
    _cleanup(memory, session, layout)
    memory.close()
    return total / seconds


def _cleanup(memory: Memory, session: str, layout: str) -> None:
    context = ExecutionContext(session_id=session)
    for key in ["hot", "warm-up"] if layout == "hot" else [f"b{b}" for b in range(BUFFERS)]:
        memory.delete(SCOPE, key, context=context)


# -- cost per message vs length ----------------------------------------------------------
def per_message_us(url: str, length: int, samples: int = 200) -> float:
    """Mean µs of one single-message append to a conversation of ``length`` messages."""
    conversations = 10 if length <= 1000 else 1
    session = f"bench-{uuid.uuid4().hex}"
    context = ExecutionContext(session_id=session)
    memory = Memory.from_url(url)
    timings: list[float] = []
    try:
        for c in range(conversations):
            key = f"len{length}-{c}"
            messages = stream(3000 + c)
            for _ in range(length // 100):
                memory.append(SCOPE, key, list(islice(messages, 100)), context=context)
            rest = length % 100
            if rest:
                memory.append(SCOPE, key, list(islice(messages, rest)), context=context)
            for message in islice(messages, samples // conversations):
                began = time.perf_counter()
                memory.append(SCOPE, key, message, context=context)
                timings.append(time.perf_counter() - began)
        for c in range(conversations):
            memory.delete(SCOPE, f"len{length}-{c}", context=context)
    finally:
        memory.close()
    return statistics.fmean(timings) * 1e6


# -- backends ------------------------------------------------------------------------------
@contextmanager
def backends(names: list[str], postgres: str, redis: str,
             max_writers: int) -> Iterator[list[tuple[str, str | None, str]]]:
    """``(name, url or None, note)`` for each backend; the URL is None when it cannot open."""
    with tempfile.TemporaryDirectory(prefix="flowmem-scale-") as tmp:
        found: list[tuple[str, str | None, str]] = []
        for name in names:
            if name == "sqlite":
                url = f"sqlite:///{Path(tmp) / 'scale.db'}"
            elif name == "postgres":
                url = _with(postgres, schema=BENCH_SCHEMA, pool_max=max(10, max_writers))
            elif name == "redis":
                url = redis
            else:
                raise SystemExit(f"unknown backend {name!r}")
            try:
                open_store(url).close()
                found.append((name, url, ""))
            except (FlowmemError, ImportError) as exc:
                found.append((name, None, f"not available: {exc}"))
        try:
            yield found
        finally:
            if any(name == "postgres" and url for name, url, _ in found):
                _drop_pg_schema(postgres)


def _drop_pg_schema(postgres: str) -> None:
    with suppress(Exception):
        import psycopg

        with psycopg.connect(postgres, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{BENCH_SCHEMA}" CASCADE')


def _server_versions(found: list[tuple[str, str | None, str]]) -> str:
    import sqlite3

    notes = [f"SQLite {sqlite3.sqlite_version}"]
    for name, url, _ in found:
        if name == "postgres" and url:
            with suppress(Exception):
                import psycopg

                with psycopg.connect(_with(url.split("?")[0])) as conn:
                    row = conn.execute("SHOW server_version").fetchone()
                    notes.append(f"PostgreSQL {row[0] if row else '?'}")
    return ", ".join(notes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="sqlite,postgres,redis")
    parser.add_argument("--postgres", default=os.environ.get(
        "FLOWMEM_TEST_POSTGRES", "postgresql://127.0.0.1:5432/test"))
    parser.add_argument("--redis", default=os.environ.get(
        "FLOWMEM_TEST_REDIS", "redis://127.0.0.1:6379/15"))
    parser.add_argument("--writers", default="1,4,16")
    parser.add_argument("--modes", default="threads,processes")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--lengths", default="100,10000")
    args = parser.parse_args(argv)
    writer_counts = [int(n) for n in args.writers.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    lengths = [int(n) for n in args.lengths.split(",")]
    with backends(args.backends.split(","), args.postgres, args.redis,
                  max(writer_counts)) as found:
        print(f"# flowmem scale benchmark\n\n{os.cpu_count()} CPU cores, Python "
              f"{platform.python_version()}, {_server_versions(found)}; "
              f"{args.seconds:g} s per cell; one append = one workload message through "
              f"Memory.append.\n", flush=True)
        print("| backend | writers | writers are | 1 hot buffer (appends/s) "
              "| 64 buffers (appends/s) |")
        print("|---|---:|---|---:|---:|", flush=True)
        for name, url, note in found:
            if url is None:
                print(f"| {name} | — | — | {note} | |", flush=True)
                continue
            for mode in modes:
                for writers in writer_counts:
                    hot = throughput(url, writers, "hot", mode, args.seconds)
                    spread = throughput(url, writers, "spread", mode, args.seconds)
                    print(f"| {name} | {writers} | {mode} | {hot:,.0f} | {spread:,.0f} |",
                          flush=True)
        print()
        header = " | ".join(f"µs/message at {n:,}" for n in lengths)
        print(f"| backend | {header} | ratio {lengths[-1]:,} / {lengths[0]:,} |")
        print("|---|" + "---:|" * (len(lengths) + 1), flush=True)
        for name, url, note in found:
            if url is None:
                print(f"| {name} | {note} |" + " |" * len(lengths), flush=True)
                continue
            costs = [per_message_us(url, n) for n in lengths]
            cells = " | ".join(f"{c:,.0f}" for c in costs)
            print(f"| {name} | {cells} | {costs[-1] / costs[0]:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
