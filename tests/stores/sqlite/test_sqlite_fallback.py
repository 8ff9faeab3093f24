"""MEM-12 forced fallback: the buffer's lock is held past the bounded wait.

Another thread, or another process, takes the conversation's lock with
``store.lock(key, timeout)`` and keeps it while writers append through
``Memory(store, lock_timeout=0.1)``. Every append made while the lock is held
must go ahead unserialized (``result.serialized is False``) with exactly one
warning, never fail, never hang, and never lose or double a turn; once the
lock is released (or its holder killed), appends are serialized again and
the lock is free.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from contention import (
    CONTEXT,
    KEY,
    SCOPE,
    WriterStats,
    audit,
    cycle_expected,
    hold_lock,
    run_writer,
)
from figures import Figure
from flowmem.memory import Memory
from flowmem.scopes import StorageKey, resolve_scope
from flowmem.store import Store
from flowmem.stores import open_store
from flowmem.stores.sqlite._store import SQLiteStore

pytestmark = pytest.mark.processes

WRITERS = 4
APPENDS = 12  # per writer and phase: 3 cycles of assistant, result, re-fire, user
LOCK_TIMEOUT = 0.1
BUFFER = StorageKey(SCOPE, resolve_scope(SCOPE, CONTEXT), KEY)


def _fallback_warnings(caplog: pytest.LogCaptureFixture) -> int:
    return sum(1 for r in caplog.records
               if r.name == "flowmem" and r.levelno == logging.WARNING
               and "unserialized" in r.getMessage())


def _report(label: str, memory: Memory, held: list[WriterStats], free: list[WriterStats],
            warnings: int, seconds: float, figure: Figure) -> None:
    messages = memory.read(SCOPE, KEY, context=CONTEXT).value
    result = audit(messages, cycle_expected(range(2 * WRITERS), APPENDS))
    fallbacks_held = sum(s.fallbacks for s in held)
    fallbacks = fallbacks_held + sum(s.fallbacks for s in free)
    appends_held = sum(s.appends for s in held)
    errors = [e for s in held + free for e in s.errors]
    integrity = memory.store.integrity_check() if isinstance(memory.store, SQLiteStore) else "-"
    figure(f"\nMEM-12 fallback, lock held by {label}: {appends_held} appends while held -> "
          f"{fallbacks_held} fallbacks; {sum(s.appends for s in free)} after release -> "
          f"{fallbacks - fallbacks_held} fallbacks; warnings {warnings} = fallbacks {fallbacks}; "
          f"{result.line()}; errors {len(errors)}; all writers done in {seconds:.2f}s; "
          f"integrity {integrity}")
    assert errors == []
    assert appends_held == WRITERS * APPENDS
    assert fallbacks_held == appends_held  # every append made while held fell back
    assert warnings == fallbacks
    assert result.lost == 0 and result.duplicates == 0 and result.order_violations == 0
    assert result.placeholders == 0 and result.wrong_content == 0
    assert result.stored == result.expected
    assert sum(s.refires_appended for s in held + free) == 0
    assert integrity in ("ok", "-")
    with memory.store.lock(BUFFER, 1.0) as had:  # a lock taken is always released
        assert had


def _writers_in_phases(memory: Memory, hold: Callable[[], None],
                       release: Callable[[], None]) -> tuple[list[WriterStats],
                                                             list[WriterStats], float]:
    hold()
    started = time.perf_counter()
    held = _run(memory, 0)
    release()
    free = _run(memory, WRITERS)
    return held, free, time.perf_counter() - started


def _run(memory: Memory, first: int) -> list[WriterStats]:
    barrier = threading.Barrier(WRITERS)
    results: list[WriterStats | None] = [None] * WRITERS

    def body(i: int) -> None:
        results[i] = run_writer(memory, first + i, APPENDS, barrier)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)  # no hang: each append waits at most LOCK_TIMEOUT
    assert not any(t.is_alive() for t in threads), "a writer hung behind the held lock"
    return [r for r in results if r is not None]


@pytest.fixture(params=["sqlite", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    url = ("memory://" if request.param == "memory"
           else f"sqlite:///{tmp_path / 'fallback.db'}?synchronous=normal")
    opened = open_store(url)
    yield opened
    opened.close()


def test_mem12_lock_held_by_another_thread_appends_fall_back_without_loss(
        store: Store, caplog: pytest.LogCaptureFixture, figure: Figure) -> None:
    memory = Memory(store, lock_timeout=LOCK_TIMEOUT)
    taken, give_back, had = threading.Event(), threading.Event(), []

    def holder() -> None:
        with store.lock(BUFFER, 5.0) as got:
            had.append(got)
            taken.set()
            give_back.wait(60)

    thread = threading.Thread(target=holder)

    def hold() -> None:
        thread.start()
        assert taken.wait(10)

    def release() -> None:
        give_back.set()
        thread.join(10)

    with caplog.at_level(logging.WARNING, logger="flowmem"):
        held, free, seconds = _writers_in_phases(memory, hold, release)
    assert had == [True]
    _report(f"another thread ({type(store).__name__})", memory, held, free,
            _fallback_warnings(caplog), seconds, figure)


@pytest.mark.parametrize("ending", ["release", "sigkill"])
def test_mem12_lock_held_by_another_process_appends_fall_back_without_loss(
        ending: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        figure: Figure) -> None:
    url = f"sqlite:///{tmp_path / 'fallback.db'}?synchronous=normal"
    memory = Memory.from_url(url, lock_timeout=LOCK_TIMEOUT)
    ctx = multiprocessing.get_context("spawn")
    taken, give_back, had = ctx.Event(), ctx.Event(), ctx.Value("i", -1)
    process = ctx.Process(target=hold_lock, args=(url, taken, give_back, had))

    def hold() -> None:
        process.start()
        assert taken.wait(30)
        assert had.value == 1

    def release() -> None:
        if ending == "release":
            give_back.set()
        else:  # the kernel drops a dead process's byte-range locks
            assert process.pid is not None
            os.kill(process.pid, signal.SIGKILL)
        process.join(10)

    try:
        with caplog.at_level(logging.WARNING, logger="flowmem"):
            held, free, seconds = _writers_in_phases(memory, hold, release)
        _report(f"another process ({ending})", memory, held, free,
                _fallback_warnings(caplog), seconds, figure)
        assert process.exitcode == (0 if ending == "release" else -signal.SIGKILL)
    finally:
        # never set() an Event a SIGKILLed waiter was sleeping on: notify_all
        # would wait forever for the dead sleeper to acknowledge
        if process.is_alive():
            process.kill()
            process.join(10)
        memory.close()
