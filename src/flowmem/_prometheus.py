"""The ``prometheus_client`` collector of :class:`flowmem.metrics.Metrics`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .errors import MissingDependency
from .metrics import BUCKETS, COUNTERS

if TYPE_CHECKING:
    from .metrics import Metrics

try:
    from prometheus_client.core import (
        REGISTRY,
        CounterMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency("prometheus_client", "server") from exc

__all__ = ["register"]


class _Collector:
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        data = dict(self._metrics._families())
        counters = data["counters"]
        for name, help_text in COUNTERS.items():
            family = CounterMetricFamily(f"flowmem_{name}", help_text, labels=["backend"])
            for (counter, backend), value in sorted(counters.items()):
                if counter == name:
                    family.add_metric([backend], value)
            yield family
        refusals = CounterMetricFamily("flowmem_refusals", "Refused scopes (MEM-7)",
                                       labels=["operation"])
        for operation, value in sorted(data["refusals"].items()):
            refusals.add_metric([operation], value)
        yield refusals
        errors = CounterMetricFamily("flowmem_store_errors", "Store calls that raised",
                                     labels=["operation", "backend", "error"])
        for labels, value in sorted(data["errors"].items()):
            errors.add_metric(list(labels), value)
        yield errors
        latency = HistogramMetricFamily("flowmem_store_call_seconds",
                                        "Latency of store calls", labels=["operation", "backend"])
        for (operation, backend), (buckets, _count, total) in sorted(data["latency"].items()):
            running, points = 0, []
            for bound, hits in zip([*map(str, BUCKETS), "+Inf"], buckets, strict=True):
                running += hits
                points.append((bound, running))
            latency.add_metric([operation, backend], points, total)
        yield latency


def register(metrics: Metrics, registry: Any = None) -> _Collector:
    collector = _Collector(metrics)
    (registry if registry is not None else REGISTRY).register(collector)
    return collector
