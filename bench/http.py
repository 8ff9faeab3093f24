"""HTTP benchmark: appends/s and p50/p99 latency through ``flowmem serve``.

``python bench/http.py [--store postgresql://127.0.0.1/test] [--clients 1,8,32]
[--seconds 5]``

Starts a real ``flowmem serve`` process per store (always SQLite in a temp
directory, plus every ``--store`` given that is reachable), creates a token
with ``flowmem token create``, then for each concurrency level runs that many
clients (threads, one keep-alive connection and one session each), every
client appending one user turn per request to its own session
(``POST /v1/sessions/{id}/turns``) for ``--seconds``. Prints a markdown
table. Not a test.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder leads sys.path and its name would shadow the
# standard library's ``http`` package that httpx imports: drop the folder first.
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import argparse
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

import httpx


def _flowmem(*args: str) -> list[str]:
    script = shutil.which("flowmem")
    return [script, *args] if script else [sys.executable, "-m", "flowmem.cli", *args]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serve(store: str) -> Iterator[str]:
    """A running ``flowmem serve`` on ``store``; yields its base URL."""
    port = _free_port()
    process = subprocess.Popen(_flowmem("serve", "--store", store, "--port", str(port),
                                        "--rate-limit", "0",
                                        "--log-level", "warning"))
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
        yield base
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)


def _token(store: str, user: str) -> str:
    done = subprocess.run(_flowmem("token", "create", "--user", user, "--store", store),
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip() or done.stdout.strip())
    return done.stdout.strip()


def _client_loop(base: str, token: str, deadline: dict[str, float], latencies: list[float],
                 start: threading.Barrier) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base, headers=headers, timeout=60) as http:
        sid = http.post("/v1/sessions", json={"title": "bench"}).json()["data"]["id"]
        url = f"/v1/sessions/{sid}/turns"
        start.wait()  # every client has its session; the clock starts
        n = 0
        while time.monotonic() < deadline["at"]:
            body = {"messages": [{"role": "user", "content": f"message {n}"}]}
            began = time.perf_counter()
            response = http.post(url, json=body)
            latencies.append(time.perf_counter() - began)
            if response.status_code != 200:
                raise RuntimeError(f"append answered {response.status_code}: {response.text}")
            n += 1


def measure(base: str, token: str, clients: int,
            seconds: float) -> tuple[int, float, float, float]:
    """(appends, appends/s, p50 ms, p99 ms) for ``clients`` concurrent clients."""
    per_client: list[list[float]] = [[] for _ in range(clients)]
    deadline = {"at": 0.0, "began": 0.0}

    def go() -> None:  # the clock starts once every client has its session (cold pools)
        deadline["began"] = time.monotonic()
        deadline["at"] = deadline["began"] + seconds

    start = threading.Barrier(clients + 1, action=go)
    threads = [threading.Thread(target=_client_loop, daemon=True,
                                args=(base, token, deadline, per_client[i], start))
               for i in range(clients)]
    for thread in threads:
        thread.start()
    start.wait()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - deadline["began"]
    latencies = sorted(x for lat in per_client for x in lat)
    if not latencies:
        return 0, 0.0, 0.0, 0.0
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return (len(latencies), len(latencies) / elapsed, statistics.median(latencies) * 1e3,
            p99 * 1e3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", action="append", default=[],
                        help="an extra store URL to measure (e.g. postgresql://127.0.0.1/test)")
    parser.add_argument("--clients", default="1,8,32", help="concurrency levels")
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each level")
    args = parser.parse_args(argv)
    levels = [int(x) for x in args.clients.split(",") if x.strip()]
    rows: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        stores = [("sqlite", f"sqlite:///{Path(tmp) / 'bench.db'}")]
        stores += [(url.split("://", 1)[0], url) for url in args.store]
        for name, url in stores:
            try:
                token = _token(url, "bench")
            except RuntimeError as exc:
                print(f"skipping {name}: {exc}", file=sys.stderr)
                continue
            with serve(url) as base:
                for clients in levels:
                    appends, rate, p50, p99 = measure(base, token, clients, args.seconds)
                    rows.append(f"| {name} | {clients} | {appends} | {rate:,.0f} | "
                                f"{p50:.1f} | {p99:.1f} |")
                    print(rows[-1], file=sys.stderr, flush=True)
    print("| store | clients | appends | appends/s | p50 ms | p99 ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
