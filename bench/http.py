"""HTTP benchmark: appends/s, p50/p99 latency and CPU per append through ``flowmem serve``.

``python bench/http.py [--store postgresql://127.0.0.1/test?schema=bench_http]
[--clients 1,8,32] [--seconds 5] [--generator wrk|threads]
[--server NAME=PYTHON ...] [--repeat N] [--prefer return=minimal] [--workers 1,2]``

Starts a real ``flowmem serve`` process per store and server (always SQLite,
a fresh file in a temp directory per start, plus every ``--store`` given that
is reachable), creates a token with ``flowmem token create``, then for each
concurrency level N creates N sessions and runs N clients, one keep-alive
connection and one session each, every client appending one user turn per
request (``POST /v1/sessions/{id}/turns``) for ``--seconds``.

Generators: ``wrk`` (the default when ``wrk`` is installed: a C load
generator, one thread and one connection per client, ``bench/http_turns.lua``)
costs a fraction of the server's CPU; ``threads`` (httpx clients in Python
threads of this process) costs about as much CPU as the server and shares
its two cores, so it understates the server. Every row says the generator,
the CPU seconds the server and the generator spent per 1,000 appends (from
``/proc`` and ``getrusage``: robust on a loaded machine, where rates are
not), and the load average when the row began.

``--workers 1,2`` serves with ``flowmem serve --workers N`` for each count
(CPU is then summed over the worker processes).

``--server NAME=PYTHON`` (repeatable) serves with another interpreter (e.g.
``before=/work/venv/bin/python``, a venv where another checkout is
installed); with several, every level runs on each server in turn, ``--repeat``
times, interleaved, so a change of the machine's load hits every server alike.
Prints a markdown table. Not a test.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder leads sys.path and its name would shadow the
# standard library's ``http`` package that httpx imports: drop the folder first.
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import argparse
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx

LUA = Path(__file__).resolve().parent / "http_turns.lua"
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Figures:
    """One measured level."""

    appends: int
    rate: float
    p50_ms: float
    p99_ms: float
    server_cpu: float  # CPU seconds of the server per 1,000 appends
    client_cpu: float  # CPU seconds of the generator per 1,000 appends


def _flowmem(python: str | None, *args: str) -> list[str]:
    if python is not None:
        return [python, "-m", "flowmem.cli", *args]
    script = shutil.which("flowmem")
    return [script, *args] if script else [sys.executable, "-m", "flowmem.cli", *args]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a running process and its running children
    (``--workers``), from Linux ``/proc``."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except FileNotFoundError:
        return 0.0
    own = (int(fields[11]) + int(fields[12])) / _TICK
    children = [int(child) for task in Path(f"/proc/{pid}/task").iterdir()
                for child in (task / "children").read_text().split()]
    return own + sum(cpu_seconds(child) for child in children)


@contextmanager
def serve(store: str, python: str | None = None,
          workers: int = 1) -> Iterator[tuple[str, int]]:
    """A running ``flowmem serve`` on ``store``; yields its base URL and pid."""
    port = _free_port()
    process = subprocess.Popen(_flowmem(python, "serve", "--store", store, "--port", str(port),
                                        "--rate-limit", "0", "--log-level", "warning",
                                        *(["--workers", str(workers)] if workers > 1 else [])))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"flowmem serve exited with {process.returncode}")
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("flowmem serve did not come up")
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


def _client_loop(base: str, secret: str, sid: str, deadline: dict[str, float],
                 latencies: list[float], start: threading.Barrier, prefer: str) -> None:
    headers = {"Authorization": f"Bearer {secret}", **({"Prefer": prefer} if prefer else {})}
    with httpx.Client(base_url=base, headers=headers, timeout=60) as http:
        url = f"/v1/sessions/{sid}/turns"
        http.get("/healthz")  # the connection is open before the clock starts
        start.wait()
        n = 0
        while time.monotonic() < deadline["at"]:
            body = {"messages": [{"role": "user", "content": f"message {n}"}]}
            began = time.perf_counter()
            response = http.post(url, json=body)
            latencies.append(time.perf_counter() - began)
            if response.status_code != 200:
                raise RuntimeError(f"append answered {response.status_code}: {response.text}")
            n += 1


def measure_threads(base: str, secret: str, sids: list[str], seconds: float, pid: int,
                    prefer: str = "") -> Figures:
    """The figures of ``len(sids)`` httpx clients in threads of this process."""
    per_client: list[list[float]] = [[] for _ in sids]
    deadline = {"at": 0.0, "began": 0.0}
    marks: dict[str, float] = {}

    def go() -> None:
        deadline["began"] = time.monotonic()
        deadline["at"] = deadline["began"] + seconds
        marks.update(server=cpu_seconds(pid), client=time.process_time())

    start = threading.Barrier(len(sids) + 1, action=go)
    threads = [threading.Thread(target=_client_loop, daemon=True,
                                args=(base, secret, sid, deadline, per_client[i], start, prefer))
               for i, sid in enumerate(sids)]
    for thread in threads:
        thread.start()
    start.wait()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - deadline["began"]
    server, client = cpu_seconds(pid) - marks["server"], time.process_time() - marks["client"]
    latencies = sorted(x for lat in per_client for x in lat)
    if not latencies:
        return Figures(0, 0.0, 0.0, 0.0, 0.0, 0.0)
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    per = 1000 / len(latencies)
    return Figures(len(latencies), len(latencies) / elapsed, statistics.median(latencies) * 1e3,
                   p99 * 1e3, server * per, client * per)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure_wrk(base: str, secret: str, sids: list[str], seconds: float, pid: int,
                prefer: str = "") -> Figures:
    """The figures of ``wrk``: one thread and one connection per session."""
    n = len(sids)
    env = {**os.environ, "FLOWMEM_TOKEN": secret, "FLOWMEM_SESSIONS": ",".join(sids),
           "FLOWMEM_PREFER": prefer}
    server, client = cpu_seconds(pid), _children_cpu()
    done = subprocess.run(["wrk", "-t", str(n), "-c", str(n), "-d", f"{seconds:g}s",
                           "--timeout", "60s", "-s", str(LUA), base], env=env,
                          capture_output=True, text=True, check=True)
    server, client = cpu_seconds(pid) - server, _children_cpu() - client
    lines = [line for line in done.stdout.splitlines() if line.startswith('{"requests"')]
    if not lines:
        raise RuntimeError(f"wrk said: {done.stdout}{done.stderr}")
    found = json.loads(lines[-1])
    if found["non2xx"] or found["errors"]:
        raise RuntimeError(f"wrk saw failures: {found}")
    count = max(found["requests"], 1)
    per = 1000 / count
    return Figures(found["requests"], found["requests"] / (found["duration_us"] / 1e6),
                   found["p50_us"] / 1e3, found["p99_us"] / 1e3, server * per, client * per)


def _servers(specs: list[str]) -> list[tuple[str, str | None]]:
    if not specs:
        return [("this", None)]
    pairs = [spec.partition("=") for spec in specs]
    return [(name, python or None) for name, _, python in pairs]


def _variants(servers: list[tuple[str, str | None]],
              workers: str) -> list[tuple[str, str | None, int]]:
    """Each server at each ``--workers`` count (named ``NAME/wN`` beyond one count)."""
    counts = [int(x) for x in workers.split(",") if x.strip()]
    return [(f"{name}/w{count}" if len(counts) > 1 else name, python, count)
            for name, python in servers for count in counts]


def _row(store: str, server: str, generator: str, clients: int, f: Figures) -> str:
    load = os.getloadavg()[0]
    return (f"| {store} | {server} | {generator} | {clients} | {f.appends} | {f.rate:,.0f} | "
            f"{f.p50_ms:.1f} | {f.p99_ms:.1f} | {f.server_cpu:.2f} | {f.client_cpu:.2f} | "
            f"{load:.2f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", action="append", default=[],
                        help="an extra store URL to measure (e.g. postgresql://127.0.0.1/test)")
    parser.add_argument("--no-sqlite", action="store_true", help="only the --store URLs")
    parser.add_argument("--clients", default="1,8,32", help="concurrency levels")
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each level")
    parser.add_argument("--generator", choices=["wrk", "threads"],
                        default="wrk" if shutil.which("wrk") else "threads")
    parser.add_argument("--server", action="append", default=[], metavar="NAME=PYTHON",
                        help="serve with this interpreter (repeatable: interleaved A/B)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds over every server")
    parser.add_argument("--prefer", default="", help="a Prefer header for every append")
    parser.add_argument("--workers", default="1",
                        help="server processes (comma-separated: each count is a server)")
    args = parser.parse_args(argv)
    levels = [int(x) for x in args.clients.split(",") if x.strip()]
    measure = measure_wrk if args.generator == "wrk" else measure_threads
    rows: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.repeat):
            for index, (server, python, workers) in enumerate(
                    _variants(_servers(args.server), args.workers)):
                stores = [] if args.no_sqlite else [
                    ("sqlite", f"sqlite:///{Path(tmp) / f'bench-{round_}-{index}.db'}")]
                stores += [(url.split("://", 1)[0], url) for url in args.store]
                for name, url in stores:
                    try:
                        secret = token(url, "bench", python)
                    except RuntimeError as exc:
                        print(f"skipping {name}: {exc}", file=sys.stderr)
                        continue
                    with serve(url, python, workers) as (base, pid):
                        for clients in levels:
                            sids = sessions(base, secret, clients)
                            figures = measure(base, secret, sids, args.seconds, pid,
                                              args.prefer)
                            rows.append(_row(name, server, args.generator, clients, figures))
                            print(rows[-1], file=sys.stderr, flush=True)
    print("| store | server | generator | clients | appends | appends/s | p50 ms | p99 ms | "
          "server CPU s/1k | client CPU s/1k | load |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
