"""Smoke test of bench/integrations_bench.py at a tiny length (no time asserted)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

pytest.importorskip("langgraph")
pytest.importorskip("agents")
bench = pytest.importorskip("bench.integrations_bench")


@pytest.mark.parametrize("make", ["langgraph", "agents"])
def test_flowmem_contenders_are_sendable_and_the_frameworks_not(make: str,
                                                                tmp_path: Any) -> None:
    from bench.workload import conversation, rest_of_turn

    chat = conversation(400)
    end = rest_of_turn(chat, 110) + 1
    if make == "agents":
        messages, start, stop = bench.items_of(chat), len(bench.items_of(chat[:100])), \
            len(bench.items_of(chat[:end]))
    else:
        from langchain_core.messages import convert_to_messages
        messages, start, stop = list(convert_to_messages(chat)), 100, end
    rows = bench.measure(getattr(bench, make)(tmp_path, 100), messages, start, 5, 2, stop)
    assert [ok for _, _, ok in rows] == [True, False]
