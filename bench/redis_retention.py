"""What a retention policy costs a Redis append: the same appends with and without one.

Rounds alternate between a memory with no policy and one with an idle policy
on the ``session`` scope (each round a fresh conversation of ``--appends``
one-message appends), so both see the same machine; the figure is the ratio of
their median (and p99) latencies, the medians of the rounds'. Under the
policy the append's one script also sets the expiry instant on every key of
the conversation (no round trip more). The keys it wrote are deleted after.

    python -m bench.redis_retention [--rounds 6] [--appends 500]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

from bench._common import drop_redis_prefix, interleaved
from flowmem import ExecutionContext, Memory


def _round(memory: Memory, appends: int) -> tuple[float, float]:
    context = ExecutionContext(session_id=f"s{uuid.uuid4().hex}")
    took: list[float] = []
    for _ in range(appends):
        start = time.perf_counter()
        memory.append("session", "talk", {"role": "user", "content": "x"}, context=context)
        took.append(time.perf_counter() - start)
    took.sort()
    return took[len(took) // 2], took[int(len(took) * 0.99)]


def run(url: str, rounds: int, appends: int) -> str:
    prefix = f"fmbench-{uuid.uuid4().hex[:8]}"
    base = f"{url}{'&' if '?' in url else '?'}prefix={prefix}"
    memories = {"none": Memory.from_url(base),
                "idle": Memory.from_url(base, retention={"session": "10m"})}
    try:
        figures = interleaved(rounds, {name: lambda m=memory: _round(m, appends)
                                       for name, memory in memories.items()})
    finally:
        for memory in memories.values():
            memory.close()
        drop_redis_prefix(url, prefix)
    median = {name: statistics.median(m for m, _ in got) for name, got in figures.items()}
    p99 = {name: statistics.median(p for _, p in got) for name, got in figures.items()}
    return (f"median {median['none'] * 1e6:.0f} -> {median['idle'] * 1e6:.0f} us "
            f"({median['idle'] / median['none']:.2f}x), p99 {p99['none'] * 1e6:.0f} -> "
            f"{p99['idle'] * 1e6:.0f} us ({p99['idle'] / p99['none']:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--appends", type=int, default=500)
    args = parser.parse_args()
    print(run("redis://127.0.0.1:6379/0", args.rounds, args.appends), flush=True)


if __name__ == "__main__":
    main()
