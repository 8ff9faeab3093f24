"""Run every contender at every length and write ``docs/benchmarks.md`` and its plot.

``python -m bench.compare``
    the full run (lengths 100, 1,000, 10,000 and 100,000; about 15-20
    minutes on 2 cores), written to ``docs/benchmarks.md``,
    ``docs/benchmarks-append.png`` and ``docs/benchmarks.json``;
``python -m bench.compare --quick``
    a smoke run (lengths 100 and 1,000, fewer windows), written to a
    temporary directory unless ``--out`` is given;
``python -m bench.compare --render-only``
    rewrite the Markdown and the plot from ``docs/benchmarks.json``.

Every (contender, length) is measured in its own subprocess
(:mod:`bench.run_one`), one after the other. Then the ratios the goals are
about are measured again with interleaved windows in one process
(``--paired``), so that both sides see the same disk and CPU weather:
flowmem's SQLite store against the raw sqlite3 floor at the same
durability, each flowmem store at 10,000 against itself at 100, and the
SQLite peers against flowmem at 10,000.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from . import workload
from .contenders import CONTENDERS, by_name
from .report import render

ROOT = Path(__file__).resolve().parent.parent
LENGTHS = (100, 1_000, 10_000, 100_000)
QUICK_LENGTHS = (100, 1_000)
FLOORS = (("flowmem-sqlite-full", "raw-sqlite-wal-full"),
          ("flowmem-sqlite-normal", "raw-sqlite-wal-normal"))
PEERS_AGAINST_FLOWMEM = ("langchain-sql", "agents-sqlitesession")
PAIRED_MAX_LENGTH = 10_000


def pairs_to_run(lengths: tuple[int, ...], names: list[str]) -> list[tuple[str, str, str]]:
    """(kind, A@length, B@length): the interleaved runs behind the ratios that matter."""
    pairs: list[tuple[str, str, str]] = []
    short, long = min(lengths), max(x for x in lengths if x <= PAIRED_MAX_LENGTH)
    for first, second in FLOORS:
        if first in names and second in names:
            pairs += [("floor", f"{first}@{x}", f"{second}@{x}")
                      for x in lengths if x <= PAIRED_MAX_LENGTH]
    if long > short:
        pairs += [("flat", f"{name}@{long}", f"{name}@{short}") for name in names
                  if by_name(name).kind == "flowmem"]
        pairs += [("peer", f"{name}@{long}", f"flowmem-sqlite-full@{long}")
                  for name in PEERS_AGAINST_FLOWMEM
                  if name in names and "flowmem-sqlite-full" in names]
    return pairs
TIMEOUT = 900
PACKAGES = ("flowmem", "langgraph", "langgraph-checkpoint-sqlite", "langchain-core",
            "langchain-community", "sqlalchemy", "openai-agents", "psycopg", "redis",
            "fastapi", "uvicorn", "httpx", "matplotlib", "psutil")


def _run(args: list[str], workdir: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.run_one", *args, "--workdir", str(workdir)]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                              timeout=TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        return {"status": "error", "reason": f"timed out after {TIMEOUT} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"status": "error", "reason": " | ".join(tail) or f"exit {done.returncode}"}
    result: dict[str, Any] = json.loads(lines[-1])
    result["wall_s"] = round(time.perf_counter() - started, 1)
    if result.get("status") == "error" and done.stderr:
        result["stderr_tail"] = done.stderr.strip().splitlines()[-8:]
    return result


def _meminfo_gib() -> float | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _servers() -> dict[str, str]:
    found: dict[str, str] = {}
    try:
        import psycopg

        with psycopg.connect("postgresql://127.0.0.1/test", connect_timeout=3) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            sync = conn.execute("SHOW synchronous_commit").fetchone()
            found["postgresql"] = (f"{row[0] if row else '?'} "
                                   f"(synchronous_commit={sync[0] if sync else '?'})")
    except Exception as exc:
        found["postgresql"] = f"unreachable ({type(exc).__name__})"
    try:
        import redis

        client = redis.Redis.from_url("redis://127.0.0.1:6379/0", socket_timeout=3)
        info = client.info("server")
        persistence = client.config_get("appendonly")
        found["redis"] = (f"{info.get('redis_version')} (appendonly="
                          f"{persistence.get('appendonly')}, save="
                          f"{client.config_get('save').get('save')!r})")
    except Exception as exc:
        found["redis"] = f"unreachable ({type(exc).__name__})"
    return found


def _sqlite_defaults() -> str:
    names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    with tempfile.TemporaryDirectory() as folder:
        conn = sqlite3.connect(os.path.join(folder, "probe.db"))
        journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
        plain = conn.execute("PRAGMA synchronous").fetchone()[0]
        conn.execute("PRAGMA journal_mode=WAL")
        wal = conn.execute("PRAGMA synchronous").fetchone()[0]
        conn.close()
    return (f"{names.get(plain, plain)} (journal_mode={journal}), "
            f"{names.get(wal, wal)} after journal_mode=WAL")


def flowmem_version() -> str:
    """The commit measured, and whether flowmem's sources differ from it."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True, check=False).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "src"], cwd=ROOT,
                               capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return "unknown"
    return commit + (" + uncommitted changes in src/" if dirty else "")


def machine() -> dict[str, Any]:
    versions = {}
    for package in PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return {
        "sqlite_defaults": _sqlite_defaults(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": os.cpu_count(),
        "cpu": _cpu_model(),
        "ram_gib": _meminfo_gib(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "commit": flowmem_version(),
        "packages": versions,
        "servers": _servers(),
    }


def run(lengths: tuple[int, ...], names: list[str], workdir: Path, *, quick: bool,
        paired: bool) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    started = time.perf_counter()
    version = flowmem_version()
    for length in lengths:
        for name in names:
            extra = ["--quick"] if quick else []
            result = _run([name, str(length), *extra], workdir / f"{name}-{length}")
            result.setdefault("contender", name)
            result.setdefault("length", length)
            results.append(result)
            shown = (f"{result['us_per_msg']:.1f} µs/msg" if result.get("status") == "ok"
                     else f"{result.get('status')}: {result.get('reason', '')}")
            print(f"[{time.perf_counter() - started:6.0f} s] {name:24} {length:>7}  {shown}",
                  flush=True)
    pairs: list[dict[str, Any]] = []
    if paired:
        for kind, first, second in pairs_to_run(lengths, names):
            extra = ["--quick"] if quick else []
            result = _run(["--paired", first, second, *extra],
                          workdir / f"paired-{first}-{second}")
            result["paired"] = [first, second]
            result["kind"] = kind
            pairs.append(result)
            shown = (f"ratio {result['ratio_median']:.2f}" if result.get("status") == "ok"
                     else f"{result.get('status')}: {result.get('reason', '')}")
            print(f"[{time.perf_counter() - started:6.0f} s] {first} ÷ {second}  {shown}",
                  flush=True)
    contenders = {cls.name: {"label": cls.label, "kind": cls.kind, "durability": cls.durability,
                             "reference": cls.reference, "floor": cls.floor,
                             "notes": cls.notes, "persistent": cls.persistent,
                             "max_length": cls.max_length,
                             "max_length_reason": cls.max_length_reason,
                             "doc": (sys.modules[cls.__module__].__doc__ or "").strip()}
                  for cls in (by_name(name) for name in names)}
    info = machine()
    if info["commit"] != version:
        info["commit"] = f"{version} at the start, {info['commit']} at the end"
    return {"machine": info, "quick": quick, "lengths": list(lengths),
            "seed": workload.DEFAULT_SEED, "elapsed_s": round(time.perf_counter() - started),
            "contenders": contenders, "results": results, "paired": pairs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 100 and 1,000")
    parser.add_argument("--lengths", help="comma-separated lengths (default: all)")
    parser.add_argument("--only", help="comma-separated contender names")
    parser.add_argument("--out", type=Path, help="output folder (default: docs/, or a "
                        "temporary folder with --quick)")
    parser.add_argument("--no-paired", action="store_true",
                        help="skip the interleaved flowmem / raw sqlite3 runs")
    parser.add_argument("--render-only", action="store_true",
                        help="rewrite the Markdown and plot from benchmarks.json")
    args = parser.parse_args(argv)
    out = args.out or (Path(tempfile.mkdtemp(prefix="flowmem-bench-")) if args.quick
                       else ROOT / "docs")
    out.mkdir(parents=True, exist_ok=True)
    data_path = out / "benchmarks.json"
    if args.render_only:
        data = json.loads(data_path.read_text(encoding="utf-8"))
    else:
        lengths = (tuple(int(x) for x in args.lengths.split(",")) if args.lengths
                   else QUICK_LENGTHS if args.quick else LENGTHS)
        names = args.only.split(",") if args.only else [cls.name for cls in CONTENDERS]
        for name in names:
            by_name(name)
        with tempfile.TemporaryDirectory(prefix="flowmem-bench-work-") as work:
            data = run(lengths, names, Path(work), quick=args.quick,
                       paired=not args.no_paired)
        data_path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    render(data, out)
    print(f"wrote {out / 'benchmarks.md'}, {out / 'benchmarks-append.png'}, {data_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
