"""Instructions per SQLite append, by kind of message: where the ratio to the floor is lost.

``python bench/append_kinds.py [--messages 2200] [--warmup 200]``

Runs the seeded workload (``bench/workload.py``) at ``synchronous=normal``, one
message per append on one conversation, checkpoints off (as
``bench/append_budget.py``), under ``valgrind --tool=callgrind`` with
collection on only inside ``operator.call``: each child run appends every
message, and calls the appends of ONE kind (after ``--warmup`` messages)
through ``operator.call``, so the count is what those appends cost, in the
state the workload leaves before each (repeatable whatever the load). Two
ways per kind:

``floor``   the raw floor of ``bench.compare`` (``BEGIN``, one ``INSERT`` of
            ``json.dumps(message)``, ``COMMIT``), as ``bench/sqlite_statements.py``;
``memory``  flowmem's ``Memory.append`` as shipped.

The kinds: a user turn, an assistant turn that declares no call, one that
declares calls (its declarations are a second ``INSERT``, MEM-2), and a tool
result (the MEM-1 results key). Prints each kind's share of the workload,
both counts, their ratio, and the mix. Not a test.
"""

from __future__ import annotations

import argparse
import operator
import os
import re
import subprocess
import sys
import tempfile
from itertools import islice
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import append_budget
from bench.workload import DEFAULT_SEED, stream

KINDS = ("user", "assistant", "assistant declaring calls", "tool")
WAYS = ("floor", "memory")


def kind_of(message: dict[str, Any]) -> str:
    """The kind a workload message is counted under."""
    if message["role"] == "assistant" and message.get("tool_calls"):
        return "assistant declaring calls"
    return str(message["role"])


def _child(way: str, kind: str, messages: int, warmup: int, count_file: str) -> None:
    """Append the workload; the appends of ``kind`` after ``warmup`` through
    ``operator.call`` (what callgrind collects); write how many there were."""
    workload = list(islice(stream(DEFAULT_SEED), messages))
    counted = 0
    with tempfile.TemporaryDirectory() as workdir:
        append = append_budget._way(way, f"{workdir}/{way}.db", False)
        for index, message in enumerate(workload):
            if index >= warmup and kind_of(message) == kind:
                operator.call(append, index, message)
                counted += 1
            else:
                append(index, message)
    Path(count_file).write_text(str(counted))


def instructions(way: str, kind: str, messages: int, warmup: int) -> tuple[float, int]:
    """Instructions per append of ``kind`` in ``way``, and how many were counted."""
    with tempfile.TemporaryDirectory() as out:
        count_file = f"{out}/count"
        subprocess.run(["valgrind", "--tool=callgrind", "--collect-atstart=no",
                        "--toggle-collect=_operator_call", f"--callgrind-out-file={out}/cg",
                        sys.executable, __file__, "--child", way, "--kind", kind,
                        "--messages", str(messages), "--warmup", str(warmup),
                        "--count-file", count_file],
                       check=True, capture_output=True, env={**os.environ,
                                                             "PYTHONHASHSEED": "0"})
        found = re.search(r"^(?:summary|totals):\s+(\d+)", Path(f"{out}/cg").read_text(), re.M)
        assert found is not None, "callgrind wrote no total"
        counted = int(Path(count_file).read_text())
    return int(found.group(1)) / max(counted, 1), counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=2200)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--kind", help=argparse.SUPPRESS)
    parser.add_argument("--count-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.kind, args.messages, args.warmup, args.count_file)
        return
    print("| message | share | floor | `Memory.append` | ratio |")
    print("|---|---:|---:|---:|---:|")
    totals = dict.fromkeys(WAYS, 0.0)
    appends = 0
    rows = []
    for kind in KINDS:
        (floor, counted), (memory, _) = (instructions(way, kind, args.messages, args.warmup)
                                         for way in WAYS)
        rows.append((kind, counted, floor, memory))
        totals["floor"] += floor * counted
        totals["memory"] += memory * counted
        appends += counted
    for kind, counted, floor, memory in rows:
        print(f"| {kind} | {counted / appends:.0%} | {floor:,.0f} | {memory:,.0f} | "
              f"{memory / floor:.2f}× |", flush=True)
    floor, memory = totals["floor"] / appends, totals["memory"] / appends
    print(f"| **the mix** | {appends:,} appends | **{floor:,.0f}** | **{memory:,.0f}** | "
          f"**{memory / floor:.2f}×** |")


if __name__ == "__main__":
    main()
