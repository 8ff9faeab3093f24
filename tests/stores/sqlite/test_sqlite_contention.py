"""MEM-12 on SQLite: many writers, ONE conversation, one database file.

8 threads (one ``Memory``), and separately 4 spawned processes (a store
each, pausing 0.5 ms between appends so that they interleave), × 200
appends each on the same buffer, a quarter of them re-fired tool results.
Every unique turn must be stored exactly once, in its writer's order; no
re-fire may be appended; ``PRAGMA integrity_check`` must say ok.
``synchronous=normal`` keeps the commits cheap (durability is the crash
test's business, not this one's).
"""

from __future__ import annotations

import multiprocessing
import sqlite3
import time
from pathlib import Path

import pytest

from contention import (
    CONTEXT,
    KEY,
    SCOPE,
    WriterStats,
    audit,
    cycle_expected,
    interleavings,
    process_writer,
    thread_writers,
)
from figures import Figure
from flowmem.memory import Memory
from flowmem.stores.sqlite._store import SQLiteStore

pytestmark = pytest.mark.processes

APPENDS = 200


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'contention.db'}?synchronous=normal"


def _integrity(path: Path) -> str:
    with sqlite3.connect(path) as conn:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])


def _check(memory: Memory, stats: list[WriterStats], writers: int, label: str,
           seconds: float, figure: Figure) -> None:
    messages = memory.read(SCOPE, KEY, context=CONTEXT).value
    result = audit(messages, cycle_expected(range(writers), APPENDS))
    store = memory.store
    assert isinstance(store, SQLiteStore)
    integrity = store.integrity_check()
    errors = [e for s in stats for e in s.errors]
    appends = sum(s.appends for s in stats)
    figure(f"\nMEM-12 {label}: {writers} x {APPENDS} appends = {appends} in {seconds:.2f}s, "
          f"{interleavings(messages)} writer switches in the buffer; "
          f"{result.line()}; re-fires appended {sum(s.refires_appended for s in stats)}; "
          f"placeholders replaced {sum(s.placeholders_replaced for s in stats)}; "
          f"fallbacks {sum(s.fallbacks for s in stats)}; errors {len(errors)}; "
          f"integrity {integrity}")
    assert errors == []
    assert appends == writers * APPENDS
    assert result.lost == 0
    assert result.duplicates == 0
    assert result.order_violations == 0
    assert result.placeholders == 0
    assert result.wrong_content == 0
    assert result.stored == result.expected == writers * APPENDS * 3 // 4
    assert sum(s.refires_appended for s in stats) == 0
    # every unique turn was reported appended once, except results whose call
    # another writer's user turn had healed first: those replaced it (MEM-10, 0)
    assert (sum(s.appended for s in stats) + sum(s.placeholders_replaced for s in stats)
            == result.expected)
    assert integrity == "ok"


def test_mem12_eight_threads_one_buffer_no_lost_no_duplicate_turns(tmp_path: Path,
                                                                   figure: Figure) -> None:
    with Memory.from_url(_url(tmp_path)) as memory:
        started = time.perf_counter()
        stats = thread_writers(memory, 8, APPENDS)
        seconds = time.perf_counter() - started
        _check(memory, stats, 8, "8 threads", seconds, figure)
    assert _integrity(tmp_path / "contention.db") == "ok"


def test_mem12_four_processes_one_buffer_no_lost_no_duplicate_turns(tmp_path: Path,
                                                                    figure: Figure) -> None:
    url = _url(tmp_path)
    Memory.from_url(url).close()  # create the schema before the race
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    queue = ctx.Queue()
    # a short pause between appends lets the other processes in: without it a
    # process that just released the lock usually takes it straight back
    workers = [ctx.Process(target=process_writer,
                           args=(url, w, APPENDS, barrier, queue, 5.0, 0.0005))
               for w in range(4)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    stats: list[WriterStats] = [queue.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
    seconds = time.perf_counter() - started
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]
    with Memory.from_url(url) as memory:
        _check(memory, stats, 4, "4 processes (spawn)", seconds, figure)
    assert _integrity(tmp_path / "contention.db") == "ok"
