"""Appends to live conversations while a sweep deletes 100,000 expired ones.

One run per backend, side by side: the p99 latency of appends to live
conversations, first with no sweep, then while ``Memory.sweep`` deletes
``--expired`` expired conversations ``--batch`` at a time (a thread of its
own, as ``flowmem serve``'s background sweep runs beside requests). The
figure is the ratio ``p99 during the sweep / p99 without`` (the goal: <= 2).
Redis is not measured: its expiry is the server's own (``PEXPIREAT``).

    python -m bench.retention_sweep --expired 100000 [--backend sqlite --backend postgresql]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable

from bench._common import fresh_store
from flowmem import AsyncMemory, ExecutionContext, Memory

POSTGRES = "postgresql://127.0.0.1/test"
PAST = 1_000_000_000.0  # what the seeding clock says: everything it writes has expired
LIVE = 50  # live conversations the measured appends go to, in turn


async def _seed(url: str, count: int) -> None:
    """``count`` one-message conversations, written with a clock far in the past."""
    memory = AsyncMemory.from_url(url, retention={"session": "1h"}, clock=lambda: PAST)
    tag = uuid.uuid4().hex[:8]

    async def some(start: int) -> None:
        for number in range(start, count, 32):
            await memory.append("session", "old", {"role": "user", "content": "expired"},
                                context=ExecutionContext(session_id=f"x{tag}{number}"))

    await asyncio.gather(*(some(start) for start in range(32)))
    await memory.aclose()


def _appends(memory: Memory, contexts: list[ExecutionContext],
             until: Callable[[int], bool]) -> list[float]:
    """Append to the live conversations in turn until ``until(done)``; each latency."""
    took: list[float] = []
    while not until(len(took)):
        context = contexts[len(took) % len(contexts)]
        start = time.perf_counter()
        memory.append("session", "live", {"role": "user", "content": "still here"},
                      context=context)
        took.append(time.perf_counter() - start)
    return took


def _p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98]


def run(backend: str, expired: int, batch: int = 100, baseline: int = 3000) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as directory, fresh_store(
            f"sqlite:///{directory}/sweep.db?synchronous=normal" if backend == "sqlite"
            else POSTGRES, "flowmem_bench_sweep") as url:
        asyncio.run(_seed(url, expired))
        memory = Memory.from_url(url, retention={"session": "30d"})
        contexts = [ExecutionContext(session_id=f"live{uuid.uuid4().hex}") for _ in range(LIVE)]
        _appends(memory, contexts, lambda done: done >= LIVE)  # every live one exists
        without = _appends(memory, contexts, lambda done: done >= baseline)
        sweeper = Memory.from_url(url, retention={"session": "30d"})
        finished = threading.Event()
        counts: dict[str, int] = {}

        def sweep() -> None:
            start = time.perf_counter()
            counts.update(sweeper.sweep(batch=batch).by_scope)
            counts["seconds"] = round(time.perf_counter() - start, 3)  # type: ignore[assignment]
            finished.set()

        thread = threading.Thread(target=sweep)
        thread.start()
        during = _appends(memory, contexts, lambda done: finished.is_set() and done >= 100)
        thread.join()
        memory.close()
        sweeper.close()
    return {"swept": counts.get("session", 0), "sweep_s": counts["seconds"],
            "appends_during": len(during), "p99_without_ms": round(_p99(without) * 1e3, 3),
            "p99_during_ms": round(_p99(during) * 1e3, 3),
            "ratio": round(_p99(during) / _p99(without), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", action="append", choices=["sqlite", "postgresql"])
    parser.add_argument("--expired", type=int, default=100_000)
    args = parser.parse_args()
    for backend in args.backend or ["sqlite", "postgresql"]:
        print(backend, run(backend, args.expired), flush=True)


if __name__ == "__main__":
    main()
