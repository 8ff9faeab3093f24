"""HTTP benchmark: appends/s, p50/p99 latency and CPU per append through ``flowmem serve``.

``python -m bench.http [--store URL ...] [--clients 1,8,32] [--seconds 5]
[--prefer return=minimal] [--server NAME=PYTHON ...] [--repeat N] [--workers 1,2]``:
per store (always a fresh SQLite file) and server, N sessions appended to by
``wrk`` with N keep-alive connections; the CPU per 1,000 appends of the server
(``/proc``) and of wrk (``getrusage``) is robust on a loaded machine, where rates
are not. The method is in docs/http.md ("Benchmark"). Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from bench._common import cpu_seconds, fresh_store

LUA = Path(__file__).resolve().parent / "http_turns.lua"
ROW = ("{appends} | {rate:,.0f} | {p50_ms:.1f} | {p99_ms:.1f} | {server_cpu:.2f} | "
       "{client_cpu:.2f} | {load:.2f} |")


def _flowmem(python: str | None, *args: str) -> list[str]:
    return [python or sys.executable, "-m", "flowmem.cli", *args]


@contextmanager
def serve(store: str, python: str | None = None,
          workers: int = 1) -> Iterator[tuple[str, int]]:
    """A running ``flowmem serve`` on ``store``; yields its base URL and pid."""
    with serving(_flowmem(python, "serve", "--store", store, "--rate-limit", "0",
                          "--log-level", "warning",
                          *(["--workers", str(workers)] if workers > 1 else []))) as found:
        yield found


@contextmanager
def serving(command: list[str]) -> Iterator[tuple[str, int]]:
    """A running server, ``command --port <free port>``, once ``GET /healthz`` answers 200;
    yields its base URL and pid."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    process = subprocess.Popen([*command, "--port", str(port)])
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{command[0]} exited with {process.returncode}")
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{command[0]} did not come up")
            time.sleep(0.05)
        yield base, process.pid
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)


def token(store: str, user: str, python: str | None = None) -> str:
    """A new token for ``user`` on ``store`` (``flowmem token create``)."""
    done = subprocess.run(_flowmem(python, "token", "create", "--user", user, "--store", store),
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip() or done.stdout.strip())
    return done.stdout.strip()


def sessions(base: str, secret: str, count: int) -> list[str]:
    """``count`` new sessions of the token's user."""
    headers = {"Authorization": f"Bearer {secret}"}
    with httpx.Client(base_url=base, headers=headers, timeout=60) as http:
        return [http.post("/v1/sessions", json={"title": "bench"}).json()["data"]["id"]
                for _ in range(count)]


def measure_wrk(base: str, secret: str, sids: list[str], seconds: float, pid: int,
                prefer: str = "", pace_ms: int = 0) -> dict[str, float]:
    """The figures of ``wrk`` (one thread and one connection per session, each waiting
    ``pace_ms`` after a reply: a fixed load); CPU seconds per 1,000 appends."""
    env = {**os.environ, "FLOWMEM_TOKEN": secret, "FLOWMEM_SESSIONS": ",".join(sids),
           "FLOWMEM_PREFER": prefer, "FLOWMEM_PACE_MS": str(pace_ms)}
    server, client = cpu_seconds(pid), sum(resource.getrusage(resource.RUSAGE_CHILDREN)[:2])
    done = subprocess.run(["wrk", "-t", str(len(sids)), "-c", str(len(sids)), "-d",
                           f"{seconds:g}s", "--timeout", "60s", "-s", str(LUA), base], env=env,
                          capture_output=True, text=True, check=True)
    server = cpu_seconds(pid) - server
    client = sum(resource.getrusage(resource.RUSAGE_CHILDREN)[:2]) - client  # user + system
    lines = [line for line in done.stdout.splitlines() if line.startswith('{"requests"')]
    if not lines:
        raise RuntimeError(f"wrk said: {done.stdout}{done.stderr}")
    found = json.loads(lines[-1])
    if found["non2xx"] or found["errors"]:
        raise RuntimeError(f"wrk saw failures: {found}")
    per = 1000 / max(found["requests"], 1)
    return {"appends": found["requests"], "rate": found["requests"] / found["duration_us"] * 1e6,
            "p50_ms": found["p50_us"] / 1e3, "p99_ms": found["p99_us"] / 1e3,
            "server_cpu": server * per, "client_cpu": client * per}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", action="append", default=[], help="another store URL")
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--server", action="append", default=[], metavar="NAME=PYTHON")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--prefer", default="", help="a Prefer header for every append")
    parser.add_argument("--workers", default="1", help="serve processes, e.g. 1,2")
    args = parser.parse_args(argv)
    if not shutil.which("wrk"):
        parser.error("needs wrk, the C load generator (apt install wrk)")
    counts = [int(x) for x in args.workers.split(",")]
    variants = [(f"{name}/w{count}" if len(counts) > 1 else name, python or None, count)
                for name, _, python in (spec.partition("=") for spec in args.server or ["this"])
                for count in counts]
    rows: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.repeat):
            for index, (server, python, workers) in enumerate(variants):
                stores = [("sqlite", f"sqlite:///{Path(tmp) / f'bench-{round_}-{index}.db'}"),
                          *((url.split("://", 1)[0], url) for url in args.store)]
                for name, given in stores:
                    with fresh_store(given, f"bench_http_{round_}_{index}") as url:
                        _measure(rows, name, server, url, python, workers, args)
    print("| store | server | generator | clients | appends | appends/s | p50 ms | p99 ms | "
          "server CPU s/1k | client CPU s/1k | load |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))


def _measure(rows: list[str], name: str, server: str, url: str, python: str | None,
             workers: int, args: argparse.Namespace) -> None:
    """The rows of one store and server, each client count (none when it is unreachable)."""
    try:
        secret = token(url, "bench", python)
    except RuntimeError as exc:
        print(f"skipping {name}: {exc}", file=sys.stderr)
        return
    with serve(url, python, workers) as (base, pid):
        for clients in (int(x) for x in args.clients.split(",")):
            f = measure_wrk(base, secret, sessions(base, secret, clients), args.seconds, pid,
                            args.prefer)
            rows.append(f"| {name} | {server} | wrk | {clients} | "
                        + ROW.format(**f, load=os.getloadavg()[0]))
            print(rows[-1], file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
