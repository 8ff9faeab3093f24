"""Instructions per item, counted by ``valgrind --tool=callgrind`` (repeatable whatever the load).

A benchmark's child command is run twice, doing ``low`` and then ``high`` items
after the same setup; the difference, divided by ``high - low``, is the cost of
one item without the interpreter's start-up and the setup.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["per_item", "total"]


def per_item(command: Callable[[int], Sequence[str]], low: int, high: int, *,
             seed: str = "0", cwd: Path | None = None) -> float:
    """Instructions per item of ``command(n)`` (an argv doing ``n`` items).

    ``seed`` fixes ``PYTHONHASHSEED``: string hashing decides set orders, and with them
    an SQLite append's counts vary by ±15 % from one seed to another.
    """
    counts = [total(command(n), seed=seed, cwd=cwd) for n in (low, high)]
    return (counts[1] - counts[0]) / (high - low)


def total(argv: Sequence[str], *, seed: str = "0", cwd: Path | None = None,
          toggle: str | None = None) -> int:
    """Instructions of the run of ``argv``; with ``toggle``, only those executed inside
    that function (callgrind's ``--toggle-collect``, e.g. ``builtin_any``)."""
    collect = [f"--toggle-collect={toggle}"] if toggle else []
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(["valgrind", "--tool=callgrind", *collect,
                        f"--callgrind-out-file={out}/cg", *argv], check=True,
                       capture_output=True, text=True, cwd=cwd,
                       env={**os.environ, "PYTHONHASHSEED": seed})
        text = Path(f"{out}/cg").read_text()
    found = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.M)
    assert found is not None, "callgrind wrote no total"
    return int(found.group(1))
