"""``flowmem erase --user``: the receipt as a table or JSON, a dry run that deletes nothing,
a second erasure that finds nothing, a whole-store scan that finds her nowhere, and bad
input as one line (through click's ``CliRunner``, and once as a real subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from erasure_scan import sqlite_findings
from flowmem import ExecutionContext, Memory
from flowmem.cli._main import main

pytestmark = pytest.mark.processes

FLOWMEM = str(Path(sys.executable).parent / "flowmem")


def _cli(url: str, *args: str) -> Any:
    result = CliRunner().invoke(main, [*args, "--store", url])
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        result.exception, result.output)
    return result


def _seed(url: str) -> str:
    context = ExecutionContext(user_id="alice")
    with Memory.from_url(url) as memory:
        memory.append("user", "chat", {"role": "user", "content": "SECRET"}, context=context,
                      idempotency_key="once")
        memory.write("user", "prefs", {"tone": "short"}, context=context)
    sid = _cli(url, "sessions", "create", "--owner", "alice").output.strip()
    assert _cli(url, "sessions", "viewers", "add", sid, "bob").exit_code == 0
    assert _cli(url, "token", "create", "--user", "alice").exit_code == 0
    return sid


def test_erase_prints_the_receipt_and_leaves_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "erase.db")
    url = f"sqlite:///{path}"
    _seed(url)
    dry = _cli(url, "erase", "--user", "alice", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert dry.output.startswith("would erase user alice at ")
    assert "conversations        1" in dry.output and "SECRET" not in dry.output
    assert sqlite_findings(path, ["alice"])  # a dry run deletes nothing
    done = _cli(url, "erase", "--user", "alice", "--json")
    assert done.exit_code == 0, done.output
    receipt = json.loads(done.output)
    assert receipt["dry_run"] is False and receipt["user_id"] == "alice"
    assert receipt["counts"] == {"conversations": 1, "values": 1, "messages": 1,
                                 "idempotency_records": 1, "sessions": 1, "viewer_links": 1,
                                 "tokens": 1, "writer_records": 0}
    assert sqlite_findings(path, ["alice", "SECRET"]) == []
    again = json.loads(_cli(url, "erase", "--user", "alice", "--json").output)
    assert again["total"] == 0


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'erase.db'}"
    blank = _cli(url, "erase", "--user", " ")
    assert blank.exit_code == 2 and "not a usable user id" in blank.output
    proc = subprocess.run([FLOWMEM, "erase", "--user", "alice", "--store",
                           "postgresql://127.0.0.1:1/nothing?pool_timeout=1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4, proc.stderr  # the store cannot be reached
    assert proc.stderr.startswith("Error: ") and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr
