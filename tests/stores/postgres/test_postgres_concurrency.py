"""PostgreSQL under concurrency: MEM-12 across processes, kill -9, forced lock timeouts.

MEM-1 (re-fired results stored once), MEM-2 (no doubled turn), MEM-12 (appends
to one conversation serialized across threads AND processes, bounded wait,
unserialized fallback that still loses nothing) and MEM-14 (appended counts).
Each test records its figures (listed at the end of the run). Writer processes are
started with ``spawn``; they and the audit are every backend's (``contention``).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends import unavailable
from contention import (
    CONTEXT,
    KEY,
    SCOPE,
    WriterStats,
    ack_writer,
    audit,
    batch,
    batch_expected,
    batch_process,
    read_acks,
    standard_expected,
)
from figures import Figure
from flowmem import ExecutionContext
from flowmem.memory import Memory, ScopedAppendResult
from flowmem.scopes import StorageKey
from flowmem.stores import open_store
from postgres_support import throwaway_schema, unique_session, with_options

REASON = unavailable("postgres")
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

PROCESSES, THREADS, PER_THREAD = 4, 4, 200
KILL_SEED = 20261203
"""Seeds the moments at which the kill -9 test kills its writer (reproducible)."""


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with throwaway_schema("concurrency") as (schema_url, _):
        open_store(schema_url).close()  # migrate once, before the processes race
        yield schema_url


def _messages(url: str, key: StorageKey) -> list[dict[str, object]]:
    store = open_store(url)
    try:
        found, value = store.read(key)
    finally:
        store.close()
    assert found
    assert isinstance(value, list)
    return value


def test_mem12_mem1_cross_process_contention_on_one_buffer(url: str, figure: Figure) -> None:
    """4 processes x 4 threads x 200 appends to ONE buffer, re-fired results included."""
    ctx = mp.get_context("spawn")
    pooled = with_options(url, pool_max=THREADS, pool_min=THREADS)
    barrier = ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    procs = [ctx.Process(target=batch_process,
                         args=(pooled, f"p{p}", THREADS, PER_THREAD, barrier, results))
             for p in range(PROCESSES)]
    for proc in procs:
        proc.start()
    reports: list[WriterStats] = [results.get(timeout=180) for _ in procs]
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    writers = [f"p{p}t{t}" for p in range(PROCESSES) for t in range(THREADS)]
    with Memory.from_url(url) as memory:
        stored = memory.read(SCOPE, KEY, context=CONTEXT).value
    found = audit(stored, standard_expected(writers, PER_THREAD))
    elapsed = max(report.seconds for report in reports)
    appends = sum(report.appends for report in reports)
    fallbacks = sum(report.fallbacks for report in reports)
    errors = [e for report in reports for e in report.errors]
    figure(f"\nMEM-12 contention, {PROCESSES} processes x {THREADS} threads x {PER_THREAD} "
          f"appends on one buffer: {appends} appends in {elapsed:.2f}s "
          f"({appends / elapsed:.0f}/s), {found.line()}, "
          f"unserialized fallbacks {fallbacks}, errors {len(errors)}")
    assert errors == []
    assert appends == PROCESSES * THREADS * PER_THREAD
    assert found.stored == found.expected
    assert (found.lost, found.duplicates, found.torn, found.order_violations,
            found.placeholders) == (0, 0, 0, 0, 0)


def test_mem12_two_memory_processes_share_conversations(url: str, figure: Figure) -> None:
    """Two Memory instances in two processes, the same three conversations."""
    ctx = mp.get_context("spawn")
    session, keys, threads, per_thread = unique_session(), ["a", "b", "c"], 2, 150
    events = [ctx.Event() for _ in range(4)]  # kept alive until the children have them
    procs = [ctx.Process(target=ack_writer,
                         args=(url, name, keys, session, threads, per_thread, None,
                               events[2 * n], events[2 * n + 1]))
             for n, name in enumerate(("A", "B"))]
    began = time.perf_counter()
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(180)
        assert proc.exitcode == 0
    elapsed = time.perf_counter() - began
    totals = {"lost": 0, "duplicates": 0, "torn": 0, "order": 0, "stored": 0}
    for index, key in enumerate(keys):
        expected = {f"{name}t{t}:{i}" for name in ("A", "B") for t in range(threads)
                    for i in range(per_thread) if i % len(keys) == index}
        found = audit(_messages(url, StorageKey("session", session, key)),
                      batch_expected(expected))
        totals["lost"] += found.lost
        totals["duplicates"] += found.duplicates
        totals["torn"] += found.torn
        totals["order"] += found.order_violations
        totals["stored"] += found.turns
    figure(f"\nMEM-12 two Memory processes x {threads} threads x {per_thread} appends over "
          f"{len(keys)} conversations in {elapsed:.2f}s (spawn included): {totals}")
    assert totals == {"lost": 0, "duplicates": 0, "torn": 0, "order": 0,
                      "stored": 2 * threads * per_thread}


def test_mem12_kill_9_writer_mid_append_loses_no_acknowledged_turn(url: str,
                                                                   tmp_path: Path,
                                                                           figure: Figure) -> None:
    """Writer A runs throughout; writer B is killed with SIGKILL at a random moment, 5 times."""
    ctx = mp.get_context("spawn")
    session, keys, cycles = unique_session(), ["x", "y"], 5
    rng = random.Random(KILL_SEED)
    stop = ctx.Event()
    ready_a = ctx.Event()
    steady = ctx.Process(target=ack_writer,
                         args=(url, "A", keys, session, 2, None, str(tmp_path / "A.acks"),
                               ready_a, stop))
    steady.start()
    assert ready_a.wait(60)
    in_flight_kills = 0
    killed_files = []
    for cycle in range(cycles):
        ready, never = ctx.Event(), ctx.Event()
        path = str(tmp_path / f"B{cycle}.acks")
        victim = ctx.Process(target=ack_writer,
                             args=(url, f"B{cycle}", keys, session, 2, None, path, ready,
                                   never))
        victim.start()
        assert ready.wait(60)
        time.sleep(rng.uniform(0.15, 0.6))
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(30)
        assert victim.exitcode == -signal.SIGKILL
        in_flight_kills += read_acks(path).in_flight > 0
        killed_files.append(path)
    time.sleep(0.3)  # A goes on appending after the last kill
    stop.set()
    steady.join(60)
    assert steady.exitcode == 0
    lost = duplicates = torn = order = acked_total = stored_total = 0
    for key in keys:
        acked: set[str] = set()
        for path in [str(tmp_path / "A.acks"), *killed_files]:
            acked |= read_acks(path).acked.get(key, set())
        found = audit(_messages(url, StorageKey("session", session, key)),
                      batch_expected(acked))
        acked_total += len(acked)
        stored_total += found.turns
        lost, duplicates = lost + found.lost, duplicates + found.duplicates
        torn, order = torn + found.torn, order + found.order_violations
    figure(f"\nMEM-12 kill -9 (seed {KILL_SEED}): {cycles} kills "
           f"({in_flight_kills} with an append in flight), "
          f"{acked_total} acknowledged appends, {stored_total} stored turns, acknowledged "
          f"lost {lost}, duplicates {duplicates}, torn {torn}, order violations {order}")
    assert (lost, duplicates, torn, order) == (0, 0, 0, 0)
    assert acked_total > 0 and stored_total >= acked_total
    assert read_acks(str(tmp_path / "A.acks")).errors == {}


def test_mem12_forced_lock_timeout_warns_once_per_fallback_and_loses_nothing(
        url: str, caplog: pytest.LogCaptureFixture, figure: Figure) -> None:
    """Lock held for the whole first phase: every append waits 0.1 s, falls back, warns."""
    holder, store = open_store(url), open_store(url)
    impatient = Memory(store, lock_timeout=0.1)
    # the free phase waits the default 5 s: with 0.1 s, four writers taking turns on a
    # loaded machine can wait past it for each other, and fall back without a holder
    patient = Memory(store)
    session = unique_session()
    context = ExecutionContext(session_id=session)
    where = StorageKey("session", session, "conv")
    threads, per_phase = 4, 5
    outcomes: list[ScopedAppendResult] = []
    guard = threading.Lock()

    def phase(tag: str, memory: Memory) -> float:
        def writer(t: int) -> None:
            for i in range(per_phase):
                result = memory.append("session", "conv", batch(f"{tag}{t}", i),
                                       context=context)
                with guard:
                    outcomes.append(result)

        workers = [threading.Thread(target=writer, args=(t,)) for t in range(threads)]
        began = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(30)
            assert not worker.is_alive(), "an append hung"
        return time.perf_counter() - began

    try:
        with caplog.at_level(logging.WARNING, logger="flowmem"):
            with holder.lock(where, 30) as held:
                assert held
                with store.lock(where, 0.1) as other, store.lock(where, 0) as tried:
                    assert (other, tried) == (False, False)
                held_for = phase("held", impatient)
            free_for = phase("free", patient)
        warnings = [r for r in caplog.records
                    if r.name == "flowmem" and "MEM-12" in r.getMessage()]
        fallbacks = sum(not outcome.serialized for outcome in outcomes)
        expected = {f"{tag}{t}:{i}" for tag in ("held", "free") for t in range(threads)
                    for i in range(per_phase)}
        found, value = store.read(where)
        assert found
        result = audit(value, batch_expected(expected))
        figure(f"\nMEM-12 forced lock timeout (0.1 s) while the lock is held: "
              f"{len(outcomes)} appends, {fallbacks} fallbacks, {len(warnings)} warnings, "
              f"held phase {held_for:.2f}s, free phase {free_for:.2f}s, {result.line()}")
        assert fallbacks == threads * per_phase == len(warnings)
        assert all(o.serialized for o in outcomes[threads * per_phase:])
        assert all(o.appended == 2 for o in outcomes)
        assert (result.lost, result.duplicates, result.torn) == (0, 0, 0)
        assert held_for < 10
    finally:
        store.close()
        holder.close()
