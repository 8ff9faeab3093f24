"""A database file replaced under live writers (a backup moved over it, its
``-wal``/``-shm`` left in place), 20 times: the old writers fail from the
replacement on; a new store refuses to open beside the old file's live
``-wal``/``-shm`` instead of sharing them; once the old writers closed their
stores it opens the replacement, and ``PRAGMA integrity_check`` passes every
time. The same two writer processes serve every run (a store each run)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from figures import Figure
from flowmem import ExecutionContext, Memory, StoreUnavailable
from flowmem.stores.sqlite import SQLiteStore

pytestmark = [pytest.mark.processes,
              pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="Linux /proc")]

RUNS = 20
WRITER = r"""
import sys
from flowmem import ExecutionContext, Memory, StoreError
context = ExecutionContext(session_id=sys.argv[1])
for url in iter(sys.stdin.readline, ""):  # one database a run, until stdin closes
    memory = Memory.from_url(url.strip())
    i = 0
    try:
        while True:
            memory.append("session", "conv", {"role": "user", "content": f"{sys.argv[1]} {i}"},
                          context=context)
            i += 1
            if i == 1:  # its connections are open; it goes on appending
                print("ready", flush=True)
    except StoreError as exc:
        print("failed", type(exc).__name__, flush=True)
    sys.stdin.readline()  # the store stays open (its connections too) until told to go
    memory.close()
    print("closed", flush=True)
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(Path(__file__).parents[3] / "src")}


def _line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, f"writer ended early: {process.wait()}"
    return line.strip()


def _tell(process: subprocess.Popen[str], line: str) -> None:
    assert process.stdin is not None
    process.stdin.write(line + "\n")
    process.stdin.flush()


def _replace_under(writers: list[subprocess.Popen[str]], tmp_path: Path, run: int) -> None:
    """Writers live on a database, a backup moved over it: they fail, a new store refuses.
    Then they close their stores (their processes serve the next run)."""
    context = ExecutionContext(session_id="restored")
    db = tmp_path / f"x{run}.db"
    url = f"sqlite:///{db}"
    with Memory.from_url(url) as memory:
        memory.append("session", "conv", {"role": "user", "content": "old"}, context=context)
    backup = tmp_path / f"backup{run}.db"
    with Memory.from_url(f"sqlite:///{backup}") as memory:
        memory.append("session", "conv", {"role": "user", "content": "restored"},
                      context=context)
    for leftover in (f"{backup}-wal", f"{backup}-shm", f"{backup}.lock"):
        if os.path.exists(leftover):
            os.unlink(leftover)
    for writer in writers:
        _tell(writer, url)
    try:
        assert [_line(w) for w in writers] == ["ready", "ready"]
        os.replace(backup, db)  # -wal and -shm left in place, writers live
        assert all(_line(w).startswith("failed StoreUnavailable") for w in writers)
        with pytest.raises(StoreUnavailable, match="was replaced while"):
            SQLiteStore(str(db))
    finally:
        for writer in writers:
            _tell(writer, "go")
    assert [_line(w) for w in writers] == ["closed", "closed"]


def _reopen_after(url: str, context: ExecutionContext) -> int:
    """The old writers' stores are closed: the new file opens, unless they left their WAL
    (then 1: the store refused, naming it, and opened once it was deleted)."""
    db = url.removeprefix("sqlite:///")
    left_wal = 0
    try:
        store = Memory.from_url(url)
    except StoreUnavailable as exc:
        assert "belong to the old file" in str(exc), exc
        left_wal = 1
        os.unlink(f"{db}-wal")  # as the error says: the old file's, not the new one's
        os.unlink(f"{db}-shm")
        store = Memory.from_url(url)
    with store:
        for i in range(20):
            store.append("session", "conv", {"role": "user", "content": f"new {i}"},
                         context=context)
        texts = [m["content"] for m in store.history("session", "conv", context=context).messages]
    assert texts == ["restored"] + [f"new {i}" for i in range(20)]
    with sqlite3.connect(db) as check:
        assert check.execute("PRAGMA integrity_check").fetchone()[0] == "ok", db
    check.close()
    return left_wal


def test_a_file_replaced_under_live_writers_is_never_shared(tmp_path: Path, figure: Figure) -> None:
    context = ExecutionContext(session_id="restored")
    refused = left_wal = 0
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, f"w{n}"], env=_env(),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
               for n in range(2)]
    try:
        for run in range(RUNS):
            _replace_under(writers, tmp_path, run)
            refused += 1
            left_wal += _reopen_after(f"sqlite:///{tmp_path / f'x{run}.db'}", context)
    finally:
        for writer in writers:
            assert writer.stdin is not None
            writer.stdin.close()
        for writer in writers:
            try:
                writer.wait(30)
            except subprocess.TimeoutExpired:  # a writer that never failed: the test did
                writer.kill()
                writer.wait()
    assert refused == RUNS
    figure(f"\nreplaced under 2 live writers x {RUNS}: new store refused {refused} times while "
          f"they lived; their WAL left behind {left_wal} times (refused, then deleted); "
          f"integrity_check ok {RUNS} of {RUNS}")
