"""Run every contender at every length; write the results and render them.

``python -m bench.compare``
    the full run (lengths 100 to 100,000; 5-20 minutes on 2 cores):
    ``docs/benchmarks.json``, then from it README.md's table (between its
    ``bench:table`` markers) and ``docs/benchmarks.md``;
``python -m bench.compare --quick [--only NAME,...] [--out DIR]``
    a smoke run (lengths 100 and 1,000, fewer windows) into a temporary
    directory or ``DIR``: README.md is left alone;
``python -m bench.compare --render-only``
    re-render README.md's table and ``docs/benchmarks.md`` from the JSON.

Each (contender, length) is measured in its own subprocess (:mod:`bench.run_one`),
then the ratios that matter again, interleaved in one process (:func:`pairs_to_run`).
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
from ._common import proc_value
from .contenders import CONTENDERS, by_name
from .report import render, splice_readme

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
            "fastapi", "uvicorn", "httpx")


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


def _servers() -> dict[str, str]:
    found: dict[str, str] = {}
    try:
        import psycopg

        with psycopg.connect("postgresql://127.0.0.1/test", connect_timeout=3) as conn:
            version, sync = (conn.execute(f"SHOW {name}").fetchone() or ("?",)
                             for name in ("server_version", "synchronous_commit"))
            found["postgresql"] = f"{version[0]} (synchronous_commit={sync[0]})"
    except Exception as exc:
        found["postgresql"] = f"unreachable ({type(exc).__name__})"
    try:
        import redis

        client = redis.Redis.from_url("redis://127.0.0.1:6379/0", socket_timeout=3)
        found["redis"] = (f"{client.info('server').get('redis_version')} (appendonly="
                          f"{client.config_get('appendonly').get('appendonly')}, save="
                          f"{client.config_get('save').get('save')!r})")
    except Exception as exc:
        found["redis"] = f"unreachable ({type(exc).__name__})"
    return found


def _sqlite_defaults() -> str:
    names = ["OFF", "NORMAL", "FULL", "EXTRA"]
    with tempfile.TemporaryDirectory() as folder:
        conn = sqlite3.connect(os.path.join(folder, "probe.db"))
        pragmas = ("journal_mode", "synchronous", "journal_mode=WAL", "synchronous")
        journal, plain, _, wal = (conn.execute(f"PRAGMA {p}").fetchone()[0] for p in pragmas)
        conn.close()
    return f"{names[plain]} (journal_mode={journal}), {names[wal]} after journal_mode=WAL"


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
        "cpu": proc_value("/proc/cpuinfo", "model name") or platform.processor() or "unknown",
        "ram_gib": round(int((proc_value("/proc/meminfo", "MemTotal") or "0 kB").split()[0])
                         / 1024 / 1024, 1),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "packages": versions,
        "servers": _servers(),
    }


def run(lengths: tuple[int, ...], names: list[str], workdir: Path, *, quick: bool,
        paired: bool) -> dict[str, Any]:
    started = time.perf_counter()
    extra = ["--quick"] if quick else []

    def measured(args: list[str], what: str, shown: str) -> dict[str, Any]:
        result = _run([*args, *extra], workdir / "-".join(a.lstrip("-") for a in args))
        if result.get("status") != "ok":
            shown = f"{result.get('status')}: {result.get('reason', '')}"
        else:
            shown = shown.format(**result)
        print(f"[{time.perf_counter() - started:6.0f} s] {what}  {shown}", flush=True)
        return result

    results = [{"contender": name, "length": length, **measured(
                   [name, str(length)], f"{name:24} {length:>7}", "{us_per_msg:.1f} µs/msg")}
               for length in lengths for name in names]
    pairs = [{**measured(["--paired", first, second], f"{first} ÷ {second}",
                         "ratio {ratio_median:.2f}"), "paired": [first, second], "kind": kind}
             for kind, first, second in (pairs_to_run(lengths, names) if paired else [])]
    fields = ("label", "kind", "durability", "reference", "floor", "notes", "persistent",
              "max_length", "max_length_reason")
    contenders = {name: {field: getattr(by_name(name), field) for field in fields}
                  for name in names}
    return {"machine": machine(), "quick": quick, "lengths": list(lengths),
            "seed": workload.DEFAULT_SEED, "elapsed_s": round(time.perf_counter() - started),
            "contenders": contenders, "results": results, "paired": pairs}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 100 and 1,000")
    parser.add_argument("--only", help="comma-separated contender names")
    parser.add_argument("--out", type=Path, help="output folder (default: docs/, or a "
                        "temporary folder with --quick); README.md only with docs/")
    parser.add_argument("--render-only", action="store_true",
                        help="re-render from benchmarks.json, measure nothing")
    args = parser.parse_args(argv)
    out = args.out or (Path(tempfile.mkdtemp(prefix="flowmem-bench-")) if args.quick
                       else ROOT / "docs")
    out.mkdir(parents=True, exist_ok=True)
    data_path = out / "benchmarks.json"
    if args.render_only:
        data = json.loads(data_path.read_text(encoding="utf-8"))
    else:
        names = args.only.split(",") if args.only else [cls.name for cls in CONTENDERS]
        for name in names:
            by_name(name)  # an unknown name fails here, not after minutes
        with tempfile.TemporaryDirectory(prefix="flowmem-bench-work-") as work:
            data = run(QUICK_LENGTHS if args.quick else LENGTHS, names, Path(work),
                       quick=args.quick, paired=True)
        data_path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    render(data, out)
    written = [data_path, out / "benchmarks.md"]
    if out.resolve() == (ROOT / "docs").resolve():
        splice_readme(data, ROOT / "README.md")
        written.append(ROOT / "README.md")
    print("wrote " + ", ".join(map(str, written)))


if __name__ == "__main__":
    main()
