"""What counting costs: µs per append with and without :class:`flowmem.metrics.Metrics`.

``python -m bench.metrics_bench [--appends 2000] [--rounds 7] [--backend memory sqlite]``
(as a module: run as a script, ``bench/http.py`` would shadow the standard library's ``http``)

The benchmark workload (:mod:`bench.workload`: re-fires, interruptions, late
results) is appended one message per call through :class:`flowmem.Memory`,
without and with a ``Metrics`` (its Prometheus collector registered in a
private registry, as ``flowmem serve`` does), in interleaved rounds on one
coordinator and one store: each round runs both sides on fresh
conversations, in alternating order, so drift on a shared machine hits both
alike. Figures: the median over the rounds of µs per
append, the difference, and the best round of each side; and first, what the coordinator spends in
``Metrics`` per append timed alone (the floor the difference cannot beat,
and the figure to trust on a loaded machine). Not run by pytest.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.workload import conversation
from flowmem import Memory
from flowmem.metrics import Metrics
from flowmem.scopes import ExecutionContext
from flowmem.store import AppendOutcome, AppendStats

CONTEXT = ExecutionContext(user_id="bench")


def _url(backend: str, where: Path) -> str:
    return "memory://" if backend == "memory" else f"sqlite:///{where / 'bench.db'}"


def _round(memory: Memory, messages: list[dict[str, Any]], key: str) -> float:
    """µs per append of ``messages``, one per call, into a fresh conversation."""
    start = time.perf_counter_ns()
    for message in messages:
        memory.append("user", key, message, context=CONTEXT)
    return (time.perf_counter_ns() - start) / 1000 / len(messages)


def measure(backend: str, appends: int, rounds: int) -> dict[str, float]:
    """Median µs per append without and with metrics, interleaved on ONE store.

    The same coordinator and store serve both sides (only ``memory.metrics`` is
    switched between rounds), so no difference between two files or two
    connections can pass for the cost of counting.
    """
    from prometheus_client import CollectorRegistry

    messages = conversation(appends)
    metrics = Metrics()
    metrics.prometheus(CollectorRegistry())
    with tempfile.TemporaryDirectory() as tmp:
        memory = Memory.from_url(_url(backend, Path(tmp)))
        figures: dict[bool, list[float]] = {False: [], True: []}
        try:
            _round(memory, messages[:50], "warm")
            for index in range(rounds):
                for counted in (False, True) if index % 2 == 0 else (True, False):
                    memory.metrics = metrics if counted else None
                    figures[counted].append(_round(memory, messages, f"{index}-{counted}"))
        finally:
            memory.close()
    assert metrics.snapshot()["counters"], "the counted side counted nothing"
    off, on = statistics.median(figures[False]), statistics.median(figures[True])
    return {"without": off, "with": on, "delta": on - off, "relative": (on - off) / off,
            "best_without": min(figures[False]), "best_with": min(figures[True])}


def counting_alone(calls: int = 200_000) -> float:
    """µs a coordinator spends in ``Metrics`` per append: one ``appended`` and one
    ``called`` (what it reports for an append), timed alone, best of five."""
    metrics = Metrics()
    outcome = AppendOutcome(count=7, appended=1, stats=AppendStats(healed=1))
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter_ns()
        for _ in range(calls):
            metrics.appended("sqlite", outcome)
            metrics.called("sqlite", "append", 0.0004)
        best = min(best, (time.perf_counter_ns() - start) / 1000 / calls)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--backend", nargs="+", default=["memory", "sqlite"],
                        choices=["memory", "sqlite"])
    args = parser.parse_args(argv)
    print(f"the counting alone (Metrics.appended + Metrics.called): "
          f"{counting_alone():.2f} µs per append")
    print(f"{args.appends} appends per round, {args.rounds} interleaved rounds, median "
          "µs per append")
    print(f"{'backend':<8} {'without':>10} {'with':>10} {'delta':>9} {'relative':>9}"
          f" {'best without':>13} {'best with':>10}")
    for backend in args.backend:
        figures = measure(backend, args.appends, args.rounds)
        print(f"{backend:<8} {figures['without']:>10.2f} {figures['with']:>10.2f} "
              f"{figures['delta']:>+9.2f} {figures['relative']:>+9.1%}"
              f" {figures['best_without']:>13.2f} {figures['best_with']:>10.2f}")


if __name__ == "__main__":
    main()
