"""Counters and latencies of a :class:`~flowmem.Memory` or :class:`~flowmem.AsyncMemory`.

Pass a :class:`Metrics` to the coordinator (``Memory(store, metrics=m)`` or
``Memory.from_url(url, metrics=m)``) and it counts, per backend, what the
rules did: appends and messages appended (MEM-14), results dropped as
duplicates (MEM-1), assistant turns dropped (MEM-2), calls healed (MEM-3),
placeholders replaced (MEM-10), refusals (MEM-7), unserialized fallbacks
(MEM-12), idempotent replays and store errors, plus a latency histogram of
each store call. Without one, nothing is counted and nothing is paid.

:meth:`Metrics.snapshot` returns plain numbers for any monitoring system;
:meth:`Metrics.prometheus` registers a ``prometheus_client`` collector (the
``flowmem serve`` ``/metrics`` endpoint uses it).
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from collections.abc import Iterator
from typing import Any, Final

from .errors import MissingDependency
from .store import AppendOutcome

__all__ = ["BUCKETS", "COUNTERS", "Metrics", "backend_name"]

BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                  2.5, 5.0, 10.0)
"""Upper bounds (seconds) of the latency histogram buckets."""

COUNTERS: Final = {
    "appends": "Appends that reached a store",
    "messages_appended": "Incoming messages that became new entries (MEM-14)",
    "results_dropped": "Tool results dropped as duplicates (MEM-1)",
    "turns_dropped": "Assistant turns dropped: every declared id known (MEM-2)",
    "calls_healed": "Interrupted calls answered with a placeholder (MEM-3)",
    "placeholders_replaced": "Placeholders replaced by the real result (MEM-10)",
    "lock_fallbacks": "Appends that ran unserialized past the lock wait (MEM-12)",
    "idempotent_replays": "Calls that repeated an idempotency key (nothing changed)",
}
"""The per-backend counters and what each counts."""

_BACKENDS: Final = {"InMemoryStore": "memory", "AsyncInMemoryStore": "memory",
                    "SQLiteStore": "sqlite", "AsyncSQLiteStore": "sqlite",
                    "PostgresStore": "postgresql", "AsyncPostgresStore": "postgresql",
                    "RedisStore": "redis", "AsyncRedisStore": "redis"}


def backend_name(store: object) -> str:
    """The ``backend`` label of a store (its class name when it is not one of ours)."""
    name = type(store).__name__
    return _BACKENDS.get(name, name)


class _Histogram:
    __slots__ = ("buckets", "count", "total")

    def __init__(self) -> None:
        self.buckets = [0] * (len(BUCKETS) + 1)
        self.count = 0
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.buckets[bisect.bisect_left(BUCKETS, seconds)] += 1
        self.count += 1
        self.total += seconds


class Metrics:
    """Thread-safe counters and histograms, shared by any number of coordinators."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, str], int] = defaultdict(int)
        self._refusals: dict[str, int] = defaultdict(int)
        self._errors: dict[tuple[str, str, str], int] = defaultdict(int)
        self._latency: dict[tuple[str, str], _Histogram] = defaultdict(_Histogram)
        self._expired: dict[tuple[str, str], int] = defaultdict(int)
        self._sweeps: dict[str, int] = defaultdict(int)

    # -- what the coordinator reports -------------------------------------------
    def appended(self, backend: str, outcome: AppendOutcome) -> None:
        """One append's outcome (MEM-1/2/3/10/12/14 counts)."""
        stats = outcome.stats
        with self._lock:
            counters = self._counters
            if outcome.replayed:
                counters["idempotent_replays", backend] += 1
                return
            counters["appends", backend] += 1
            counters["messages_appended", backend] += outcome.appended
            counters["results_dropped", backend] += stats.dropped_results
            counters["turns_dropped", backend] += stats.dropped_turns
            counters["calls_healed", backend] += stats.healed
            counters["placeholders_replaced", backend] += stats.replaced
            counters["lock_fallbacks", backend] += not outcome.serialized

    def replayed(self, backend: str) -> None:
        """A write or delete that repeated an idempotency key (nothing changed)."""
        with self._lock:
            self._counters["idempotent_replays", backend] += 1

    def refused(self, operation: str) -> None:
        """A refusal (MEM-7): no backend was called."""
        with self._lock:
            self._refusals[operation] += 1

    def called(self, backend: str, operation: str, seconds: float) -> None:
        """One store call and how long it took."""
        with self._lock:
            self._latency[operation, backend].observe(seconds)

    def failed(self, backend: str, operation: str, error: BaseException) -> None:
        """A store call that raised."""
        with self._lock:
            self._errors[operation, backend, type(error).__name__] += 1

    def swept(self, backend: str, by_scope: dict[str, int]) -> None:
        """One sweep batch and the expired conversations and values it deleted, by scope."""
        with self._lock:
            self._sweeps[backend] += 1
            for scope, count in by_scope.items():
                self._expired[backend, scope] += count

    # -- reading ------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Every counter and histogram as plain data (a copy)."""
        with self._lock:
            return {
                "counters": {f"{name}{{backend={backend}}}": value
                             for (name, backend), value in sorted(self._counters.items())},
                "refusals": dict(sorted(self._refusals.items())),
                "errors": {f"{op}{{backend={backend},error={error}}}": value
                           for (op, backend, error), value in sorted(self._errors.items())},
                "latency": {f"{op}{{backend={backend}}}": {
                    "count": h.count, "sum": h.total, "buckets": list(h.buckets)}
                    for (op, backend), h in sorted(self._latency.items())},
                "expired": {f"{{backend={backend},scope={scope}}}": value
                            for (backend, scope), value in sorted(self._expired.items())},
                "sweeps": dict(sorted(self._sweeps.items())),
            }

    def prometheus(self, registry: Any = None) -> Any:
        """Register these metrics with ``prometheus_client`` (needs that package).

        Returns the collector; ``registry`` defaults to the global one.
        """
        try:
            from prometheus_client.core import REGISTRY
        except ImportError as exc:  # pragma: no cover - exercised without the extra
            raise MissingDependency("prometheus_client", "server") from exc
        collector = _Collector(self)
        (registry if registry is not None else REGISTRY).register(collector)
        return collector

    def _families(self) -> Iterator[tuple[str, Any]]:
        """Raw data for the Prometheus collector, read under the lock."""
        with self._lock:
            yield "counters", dict(self._counters)
            yield "refusals", dict(self._refusals)
            yield "errors", dict(self._errors)
            yield "latency", {key: (list(h.buckets), h.count, h.total)
                              for key, h in self._latency.items()}
            yield "expired", dict(self._expired)
            yield "sweeps", dict(self._sweeps)


class _Collector:
    """The ``prometheus_client`` collector of a :class:`Metrics`."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        data = dict(self._metrics._families())
        counters = data["counters"]
        for name, help_text in COUNTERS.items():
            family = CounterMetricFamily(f"flowmem_{name}", help_text, labels=["backend"])
            for (counter, backend), value in sorted(counters.items()):
                if counter == name:
                    family.add_metric([backend], value)
            yield family
        yield _counter("flowmem_refusals", "Refused scopes (MEM-7)", ["operation"],
                       data["refusals"])
        yield _counter("flowmem_store_errors", "Store calls that raised",
                       ["operation", "backend", "error"], data["errors"])
        yield _counter("flowmem_expired", "Expired conversations and values a sweep deleted, "
                       "by scope", ["backend", "scope"], data["expired"])
        yield _counter("flowmem_sweep_batches", "Sweep batches run", ["backend"], data["sweeps"])
        latency = HistogramMetricFamily("flowmem_store_call_seconds",
                                        "Latency of store calls", labels=["operation", "backend"])
        for (operation, backend), (buckets, _count, total) in sorted(data["latency"].items()):
            running, points = 0, []
            for bound, hits in zip([*map(str, BUCKETS), "+Inf"], buckets, strict=True):
                running += hits
                points.append((bound, running))
            latency.add_metric([operation, backend], points, total)
        yield latency


def _counter(name: str, help_text: str, labels: list[str], values: dict[Any, float]) -> Any:
    """One counter family of ``values`` (keyed by a label value or a tuple of them)."""
    from prometheus_client.core import CounterMetricFamily

    family = CounterMetricFamily(name, help_text, labels=labels)
    for key, value in sorted(values.items()):
        family.add_metric(list(key) if isinstance(key, tuple) else [key], value)
    return family
