"""Metrics for library users (#15): what the rules did, counted per backend, on both
faces, at no cost without a Metrics object; the Prometheus collector."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flowmem import AsyncMemory, ExecutionContext, Memory
from flowmem.metrics import Metrics

CTX = ExecutionContext(user_id="u", workflow_id="wf")
ANON = ExecutionContext(user_id=0)


def _call(i: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": i, "type": "function",
                            "function": {"name": "f", "arguments": "{}"}}]}


def _workload(append: Any) -> None:
    append([{"role": "user", "content": "q"}, _call("a")])
    append([{"role": "tool", "tool_call_id": "a", "content": "1"}])
    append([{"role": "tool", "tool_call_id": "a", "content": "1 again"}])  # MEM-1
    append([_call("a")])  # MEM-2
    append([_call("b"), {"role": "user", "content": "next"}])  # MEM-3 heals b
    append([{"role": "tool", "tool_call_id": "b", "content": "late"}])  # MEM-10


EXPECTED = {"appends{backend=memory}": 6, "messages_appended{backend=memory}": 5,
            "results_dropped{backend=memory}": 1, "turns_dropped{backend=memory}": 1,
            "calls_healed{backend=memory}": 1, "placeholders_replaced{backend=memory}": 1,
            "lock_fallbacks{backend=memory}": 0}


def test_counts_what_the_rules_did() -> None:
    metrics = Metrics()
    with Memory.from_url("memory://", metrics=metrics) as memory:
        _workload(lambda m: memory.append("user", "k", m, context=CTX))
        memory.read("user", "k", context=ANON)  # MEM-7
        memory.append("user", "k", [{"role": "user", "content": "x"}], context=CTX,
                      idempotency_key="i1")
        memory.append("user", "k", [{"role": "user", "content": "x"}], context=CTX,
                      idempotency_key="i1")
        for _ in range(2):  # a write and a delete repeated with their keys: one replay each
            memory.write("user", "v", 1, context=CTX, idempotency_key="w1")
            memory.delete("user", "v", context=CTX, idempotency_key="d1")
    snap = metrics.snapshot()
    assert {k: v for k, v in snap["counters"].items() if k in EXPECTED} == {
        **EXPECTED, "appends{backend=memory}": 7, "messages_appended{backend=memory}": 6}
    assert snap["counters"]["idempotent_replays{backend=memory}"] == 3
    assert snap["refusals"] == {"read": 1}
    assert snap["latency"]["append{backend=memory}"]["count"] == 8


def test_the_async_face_counts_the_same() -> None:
    metrics = Metrics()

    async def run() -> None:
        async with AsyncMemory.from_url("memory://", metrics=metrics) as memory:
            for turn in _turns():
                await memory.append("user", "k", turn, context=CTX)

    def _turns() -> list[list[dict[str, Any]]]:
        out: list[list[dict[str, Any]]] = []
        _workload(out.append)
        return out

    asyncio.run(run())
    counters = metrics.snapshot()["counters"]
    assert {k: v for k, v in counters.items() if k in EXPECTED} == EXPECTED


def test_store_errors_are_counted(tmp_path: Any) -> None:
    metrics = Metrics()
    with Memory.from_url(f"sqlite:///{tmp_path / 'm.db'}", metrics=metrics) as memory:
        memory.write("workflow", "v", 1, context=CTX)
        with pytest.raises(Exception, match="plain value"):
            memory.append("workflow", "v", {"role": "user", "content": "x"}, context=CTX)
    assert metrics.snapshot()["errors"] == {"append{backend=sqlite,error=KeyConflict}": 1}


def test_prometheus_collector_exposes_the_counters() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    metrics = Metrics()
    metrics.prometheus(registry)
    with Memory.from_url("memory://", metrics=metrics) as memory:
        _workload(lambda m: memory.append("user", "k", m, context=CTX))
    text = prometheus_client.generate_latest(registry).decode()
    assert 'flowmem_calls_healed_total{backend="memory"} 1.0' in text
    assert 'flowmem_results_dropped_total{backend="memory"} 1.0' in text
    assert 'flowmem_store_call_seconds_count{backend="memory",operation="append"} 6.0' in text
