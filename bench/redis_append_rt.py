"""Redis append: round trips and µs per append, of this tree against another (A/B).

``python bench/redis_append_rt.py --against /work/venv/bin/python [--appends 2000]
[--rounds 5] [--url redis://127.0.0.1:6379/15]``

Each measurement is a child process (``--worker``) running one face of the
Redis store on one conversation: one-message appends cycling user, assistant
declaring a call, its result, answer (window 50) — the common path. It
reports, per append, the median wall time (sub-windows of 100), the CPU time
of the client process (``time.process_time`` over the run) and the round
trips, counted by a TCP proxy in a short separate run (a burst of requests
after a reply is one round trip). The child imports whatever ``flowmem`` its
interpreter has: this tree's with ``sys.executable``, the other tree's with
``--against`` (a venv with that tree installed editable). Rounds alternate
the two interpreters (and which goes first) so background load hits both
alike; the figures are medians over the rounds. The Redis server's own CPU
is inside the wall time, not the CPU figure. Not run by pytest.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import redis_faces as faces

WINDOW = 50


def workload(n: int) -> list[list[Any]]:
    """``n`` one-message appends (``redis_faces.workload``: user, call, result, answer)."""
    return faces.workload(n, "c")


def _trips(proxy: Any) -> int:
    return int(proxy.round_trips) if proxy is not None else 0


def _sync_run(url: str, appends: int, proxy: Any = None) -> tuple[list[float], float, int]:
    from flowmem import StorageKey
    from flowmem.stores.redis import RedisStore

    store = RedisStore.from_url(url)
    key = StorageKey("workflow", uuid.uuid4().hex, "conv")
    batches = workload(appends)
    store.append(key, batches[0], max_messages=WINDOW, lock_timeout=5.0)  # connected, warm
    durations = []
    trips = _trips(proxy)
    cpu = time.process_time()
    for batch in batches[1:]:
        began = time.perf_counter()
        store.append(key, batch, max_messages=WINDOW, lock_timeout=5.0)
        durations.append(time.perf_counter() - began)
    cpu = time.process_time() - cpu
    trips = _trips(proxy) - trips
    store.close()
    return durations, cpu, trips


async def _async_run(url: str, appends: int,
                     proxy: Any = None) -> tuple[list[float], float, int]:
    from flowmem import StorageKey
    from flowmem.stores.redis_async import AsyncRedisStore

    store = AsyncRedisStore.from_url(url)
    key = StorageKey("workflow", uuid.uuid4().hex, "conv")
    batches = workload(appends)
    await store.append(key, batches[0], max_messages=WINDOW, lock_timeout=5.0)
    durations = []
    trips = _trips(proxy)
    cpu = time.process_time()
    for batch in batches[1:]:
        began = time.perf_counter()
        await store.append(key, batch, max_messages=WINDOW, lock_timeout=5.0)
        durations.append(time.perf_counter() - began)
    cpu = time.process_time() - cpu
    trips = _trips(proxy) - trips
    await store.aclose()
    return durations, cpu, trips


def _run(face: str, url: str, appends: int,
         proxy: Any = None) -> tuple[list[float], float, int]:
    if face == "sync":
        return _sync_run(url, appends, proxy)
    return asyncio.run(_async_run(url, appends, proxy))


def worker(face: str, url: str, appends: int) -> dict[str, float]:
    """One face's figures (run in a child: the interpreter picks the tree)."""
    from redis_support import CountingProxy, url_with

    prefix = f"fmbench-{uuid.uuid4().hex[:10]}"
    try:
        durations, cpu, _ = _run(face, url_with(prefix, url), appends)
        proxy = CountingProxy(url)
        try:
            counted = 200
            trips = _run(face, url_with(prefix, proxy.url), counted + 1, proxy)[2]
        finally:
            proxy.close()
    finally:
        from redis_support import drop_prefix

        drop_prefix(prefix, url)
    return {"wall_us": faces.median_us(durations), "cpu_us": cpu / len(durations) * 1e6,
            "trips_per_append": trips / counted}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--appends", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--against", help="the other tree's python (a venv with it installed)")
    parser.add_argument("--worker", choices=["sync", "async"])
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.url, args.appends)))
        return 0
    pythons = {"this": sys.executable, **({"other": args.against} if args.against else {})}
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for n in range(args.rounds):
        order = list(pythons.items())[::1 if n % 2 == 0 else -1]
        for face in ("sync", "async"):
            for name, python in order:
                out = subprocess.run([python, __file__, "--worker", face, "--url", args.url,
                                      "--appends", str(args.appends)],
                                     capture_output=True, text=True, check=True)
                results.setdefault((name, face), []).append(json.loads(out.stdout))
    print(f"tree   face   µs/append wall   µs/append CPU   round trips/append   "
          f"[median of {args.rounds} rounds, {args.appends} appends]")
    for (name, face), runs in sorted(results.items()):
        wall = statistics.median(r["wall_us"] for r in runs)
        cpu = statistics.median(r["cpu_us"] for r in runs)
        trips = statistics.median(r["trips_per_append"] for r in runs)
        print(f"{name:6} {face:6} {wall:14.0f}   {cpu:13.0f}   {trips:18.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
