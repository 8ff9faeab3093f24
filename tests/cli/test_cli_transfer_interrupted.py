"""Interrupted transfers, on real ``flowmem`` processes and SIGINT (Ctrl-C):

- ``export -o FILE`` writes a temporary file beside FILE and renames it on
  success: interrupted, the earlier complete export is left byte for byte,
  no partial file remains, and stderr says so;
- ``import`` is idempotent per batch: interrupted once it has stored some
  messages, then run again, it stores each message exactly once.

Each interruption waits for a condition (the partial file growing, rows in
the target database), never a blind sleep."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from flowmem import ExecutionContext, Memory
from server_support import flowmem

pytestmark = pytest.mark.processes

ALICE = ExecutionContext(user_id="alice")
MESSAGES = 15_000


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}


def _fill(url: str, n: int = MESSAGES) -> list[str]:
    rng = random.Random(20261202)
    texts = [f"turn {i} " + "x" * rng.randrange(50, 150) for i in range(n)]
    with Memory.from_url(url) as memory:
        for start in range(0, n, 1000):
            memory.append("user", "chat", [{"role": "user", "content": t}
                                           for t in texts[start:start + 1000]], context=ALICE)
    return texts


def _wait(condition: object, process: subprocess.Popen[bytes], what: str,
          timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert process.poll() is None, f"the process ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout}s"
        time.sleep(0.002)


def test_an_interrupted_export_leaves_the_earlier_file_untouched(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'src.db'}"
    _fill(url)
    target = tmp_path / "part.jsonl"
    command = flowmem("export", "--store", url, "--scope", "user", "--user", "alice",
                      "--no-progress", "-o", str(target))
    first = subprocess.run(command, env=_env(), capture_output=True, timeout=120)
    assert first.returncode == 0, first.stderr
    earlier = target.read_bytes()
    assert earlier.count(b"\n") == MESSAGES
    with Memory.from_url(url) as memory:  # the next export would differ
        memory.append("user", "chat", {"role": "user", "content": "newer"}, context=ALICE)

    def partial_grew() -> bool:
        return any(p.stat().st_size > 64 * 1024 for p in tmp_path.glob(".part.jsonl.*.part"))

    process = subprocess.Popen(command, env=_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    _wait(partial_grew, process, "a partial export")
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode != 0
    assert b"export interrupted" in stderr and b"left as it was" in stderr, stderr
    assert target.read_bytes() == earlier  # the earlier complete export, byte for byte
    assert not list(tmp_path.glob(".part.jsonl.*")), "a partial file was left behind"
    # and a whole export replaces it
    again = subprocess.run(command, env=_env(), capture_output=True, timeout=120)
    assert again.returncode == 0 and target.read_bytes().count(b"\n") == MESSAGES + 1
    assert (target.stat().st_mode & 0o777) == 0o600


def test_an_interrupted_export_to_stdout_says_it_is_not_whole(tmp_path: Path) -> None:
    """stdout has no end marker: the exit status and stderr say an export was cut short."""
    url = f"sqlite:///{tmp_path / 'src.db'}"
    _fill(url)
    process = subprocess.Popen(flowmem("export", "--store", url, "--scope", "user", "--user",
                                       "alice", "--no-progress"),
                               env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None
    # some lines arrived; the rest waits in a full pipe while nothing more is read
    assert process.stdout.read(64 * 1024).count(b"\n") > 0
    process.send_signal(signal.SIGINT)
    rest, stderr = process.communicate(timeout=60)
    assert process.returncode != 0
    assert b"export interrupted" in stderr and b"not the whole export" in stderr, stderr
    assert rest.count(b"\n") < MESSAGES


def test_an_interrupted_import_run_again_stores_each_message_once(tmp_path: Path) -> None:
    source = f"sqlite:///{tmp_path / 'src.db'}"
    texts = _fill(source)
    export = tmp_path / "all.jsonl"
    done = subprocess.run(flowmem("export", "--store", source, "--scope", "user", "--user",
                                  "alice", "--no-progress", "-o", str(export)),
                          env=_env(), capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    copy = tmp_path / "copy.db"
    command = flowmem("import", "--store", f"sqlite:///{copy}", "--batch", "200",
                      "--no-progress", str(export))

    def stored() -> int:
        if not copy.exists():
            return 0
        try:
            with sqlite3.connect(f"file:{copy}?mode=ro", uri=True, timeout=0.05) as db:
                return int(db.execute("SELECT count(*) FROM messages").fetchone()[0])
        except sqlite3.Error:
            return 0

    process = subprocess.Popen(command, env=_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    _wait(lambda: stored() >= 1000, process, "1,000 imported messages")
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode != 0
    assert b"import interrupted" in stderr and b"exactly once" in stderr, stderr
    part = stored()
    assert 0 < part < MESSAGES, part
    rerun = subprocess.run(command, env=_env(), capture_output=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert b"already stored by an earlier run" in rerun.stderr
    summary = json.loads(rerun.stdout)
    assert summary["replayed"] == part and summary["appended"] == MESSAGES - part, summary
    assert stored() == MESSAGES  # each message once: not part + MESSAGES
    with Memory.from_url(f"sqlite:///{copy}") as memory:
        got = [m["content"] for m in memory.history("user", "chat", context=ALICE).messages]
    assert got == texts
