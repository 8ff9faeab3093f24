"""Smoke test of bench/retention_sweep.py at a tiny size: it seeds, sweeps and measures.

Not a benchmark: no time is asserted, only that every expired conversation was
swept while the live appends went on.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

retention_sweep = pytest.importorskip("bench.retention_sweep")


def test_the_sweep_bench_sweeps_everything_it_seeded() -> None:
    figures = retention_sweep.run("sqlite", expired=300, batch=50, baseline=200)
    assert figures["swept"] == 300
    assert figures["appends_during"] >= 100 and figures["ratio"] > 0
