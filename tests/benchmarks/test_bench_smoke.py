"""Smoke test of the comparison benchmark (bench/): the workload, the counting, the runner.

Not a benchmark: no time is asserted anywhere. It runs the seeded workload
generator, the sendability counting on hand-made histories, and the runner on
the flowmem contenders (and the Python-list floor) at a tiny length; the
LangGraph adapter only when the bench extra is installed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

workload = pytest.importorskip("bench.workload")
sendability = pytest.importorskip("bench.sendability")
run_one = pytest.importorskip("bench.run_one")

LENGTH = 100  # the seeded prefix holds re-fired results and an interrupted call


def _call(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}


def test_workload_is_seeded_and_every_length_is_a_prefix() -> None:
    long = workload.conversation(600)
    assert workload.conversation(250) == long[:250]
    assert workload.conversation(250, seed=1) != long[:250]
    assert {m["role"] for m in long} == {"user", "assistant", "tool"}


def test_workload_has_the_faults_it_promises() -> None:
    stats = workload.stats(workload.conversation(5_000))
    assert 0.02 < stats["refired"] / stats["results"] < 0.09
    assert stats["unanswered_calls"] > 0
    assert stats["late_results"] > 0
    tiny = workload.stats(workload.conversation(LENGTH))
    assert tiny["refired"] > 0 and tiny["unanswered_calls"] > 0


def test_counting_finds_duplicates_dangling_calls_and_orphans() -> None:
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [_call("a"), _call("b")]},
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "tool", "tool_call_id": "a", "content": "1"},  # re-fired at once
        {"role": "assistant", "content": "done"},
        {"role": "tool", "tool_call_id": "a", "content": "1"},  # re-fired after the answer
        {"role": "user", "content": "next"},
        {"role": "tool", "tool_call_id": "b", "content": "late"},  # b dangled; now an orphan
    ]
    counted = sendability.count(history)
    assert (counted["duplicates"], counted["dangling"], counted["orphans"]) == (2, 1, 1)
    assert not counted["sendable"]
    answered = {"role": "tool", "tool_call_id": "b", "content": "2"}
    clean = sendability.count([*history[:3], answered, history[4]])
    assert (clean["duplicates"], clean["dangling"], clean["orphans"], clean["problems"]) == (
        0, 0, 0, 0)
    assert clean["sendable"]


def test_canonical_to_openai_moves_pairing_fields_out_of_metadata() -> None:
    flat = sendability.canonical_to_openai([
        {"role": "assistant", "content": None, "metadata": {"tool_calls": [_call("x")]}},
        {"role": "tool", "content": "r", "metadata": {"tool_call_id": "x", "healed": True}},
    ])
    assert flat == [{"role": "assistant", "content": "", "tool_calls": [_call("x")]},
                    {"role": "tool", "content": "r", "tool_call_id": "x"}]


@pytest.mark.parametrize("name", ["flowmem-memory", "flowmem-sqlite-normal"])
def test_flowmem_histories_are_sendable(name: str, tmp_path: Path) -> None:
    result = run_one.measure(name, LENGTH, tmp_path, quick=True)
    assert result["status"] == "ok", result
    counted = result["sendability"]
    assert counted["duplicates"] == 0 and counted["dangling"] == 0
    assert counted["orphans"] == 0 and counted["problems"] == 0
    assert counted["healed"] >= 1  # the interrupted call got its placeholder (MEM-3)
    assert result["read_last50_count"] == 50


def test_a_store_that_keeps_everything_shows_the_workload_faults(tmp_path: Path) -> None:
    result = run_one.measure("python-list", LENGTH, tmp_path, quick=True)
    assert result["status"] == "ok", result
    counted, faults = result["sendability"], result["workload"]
    assert counted["duplicates"] == faults["refired"] > 0
    assert counted["dangling"] >= 1
    assert not counted["sendable"]


def test_langgraph_adapter_keeps_refired_results(tmp_path: Path) -> None:
    pytest.importorskip("langgraph", reason="bench extra not installed")
    pytest.importorskip("langchain_core", reason="bench extra not installed")
    result = run_one.measure("langgraph-add-messages", LENGTH, tmp_path, quick=True)
    assert result["status"] == "ok", result
    assert result["sendability"]["duplicates"] == result["workload"]["refired"]


def test_one_run_renders_the_readme_table_and_the_page_without_repeating_it(
        tmp_path: Path) -> None:
    compare = pytest.importorskip("bench.compare")
    report = pytest.importorskip("bench.report")
    names = ["flowmem-memory", "python-list"]
    data = compare.run((100, 10_000), names, tmp_path / "work", quick=True, paired=False)
    assert {r["status"] for r in data["results"]} == {"ok"}, data["results"]
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{report.START}\nold\n{report.END}\nafter\n", encoding="utf-8")
    report.splice_readme(data, readme)
    text = readme.read_text(encoding="utf-8")
    assert text.startswith("intro\n") and text.endswith(f"{report.END}\nafter\n")
    assert "old" not in text and "| flowmem `memory://` |" in text and "Measured " in text
    report.render(data, tmp_path)
    page = (tmp_path / "benchmarks.md").read_text(encoding="utf-8")
    memory_row = next(line for line in page.splitlines()
                      if line.startswith("| flowmem memory:// | none"))
    assert memory_row.split(" | ")[3] == report.SEE  # its 10,000 figure is the README's
    assert "README" not in next(line for line in page.splitlines()
                                if line.startswith("| floor: Python list | none"))
