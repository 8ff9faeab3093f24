"""Write turns across processes (``stores/sqlite_writer.py``, #14): the asyncio SQLite
store's writers queue with other processes' on a byte of the lock file instead of
sleeping in SQLite's busy handler, and take turns; every wait is bounded by
``busy_timeout`` and a dead holder's byte is the kernel's to drop."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from flowmem.errors import StoreBusy
from flowmem.messages import canonical_messages
from flowmem.scopes import StorageKey
from flowmem.stores.embedded_async import AsyncSQLiteStore
from flowmem.stores.sqlite import SQLiteStore
from flowmem.stores.sqlite_writer import WAITING, WRITER

KEY = StorageKey("session", "s1", "turns")
HOLD = textwrap.dedent("""
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR)
    fcntl.lockf(fd, getattr(fcntl, sys.argv[3]), 1, int(sys.argv[2]), os.SEEK_SET)
    print("held", flush=True)
    time.sleep(60)
""")


def _holder(lock_file: str, byte: int, kind: str = "LOCK_EX") -> subprocess.Popen[str]:
    """Another process holding one byte of the lock file (until killed)."""
    process = subprocess.Popen([sys.executable, "-c", HOLD, lock_file, str(byte), kind],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "held"
    return process


def _append(store: SQLiteStore, text: str) -> None:
    store.append(KEY, canonical_messages([{"role": "user", "content": text}]),
                 max_messages=None, lock_timeout=5.0)


def test_a_held_turn_bounds_a_queued_writer_by_busy_timeout(tmp_path: Path) -> None:
    """Another process holds the write turn: a queued writer waits busy_timeout, then
    StoreBusy (nothing stored); once the holder dies the byte is free again."""
    path = tmp_path / "w.db"
    store = SQLiteStore(str(path), busy_timeout=0.3, queue_writers=True)
    _append(store, "before")
    holder = _holder(f"{path}.lock", WRITER)
    try:
        began = time.monotonic()
        with pytest.raises(StoreBusy, match="write turn"):
            _append(store, "refused")
        assert time.monotonic() - began >= 0.3
        plain = SQLiteStore(str(path), busy_timeout=0.3)  # not queued: SQLite's lock only
        _append(plain, "unqueued")
        plain.close()
    finally:
        holder.kill()
        holder.wait()
    _append(store, "after")  # the kernel dropped the dead holder's byte
    assert [m["content"] for m in store.read(KEY)[1]] == ["before", "unqueued", "after"]
    store.close()


def test_a_waiting_process_goes_first_but_never_blocks_for_long(tmp_path: Path) -> None:
    """A process marked waiting is let in first, for at most a few ms: a waiter that never
    takes its turn (here: a process holding the mark and nothing else) costs each
    transaction that bounded yield, never a stall."""
    path = tmp_path / "y.db"
    store = SQLiteStore(str(path), busy_timeout=5.0, queue_writers=True)
    _append(store, "first")
    waiter = _holder(f"{path}.lock", WAITING, "LOCK_SH")
    try:
        began = time.monotonic()
        for n in range(5):
            _append(store, f"n{n}")
        assert time.monotonic() - began < 4.0  # 5 bounded yields, not 5 busy_timeouts
    finally:
        waiter.kill()
        waiter.wait()
    assert len(store.read(KEY)[1]) == 6
    store.close()


def test_two_queued_processes_take_turns_and_store_every_append_once(tmp_path: Path) -> None:
    """MEM-12 and the write turns: two processes, each an asyncio store appending
    concurrently to one conversation; every append stored exactly once, both served."""
    path = tmp_path / "t.db"
    script = textwrap.dedent(f"""
        import asyncio, sys
        from flowmem.messages import canonical_messages
        from flowmem.scopes import StorageKey
        from flowmem.stores.embedded_async import AsyncSQLiteStore
        async def main(tag):
            store = AsyncSQLiteStore.from_url("sqlite:///{path}?synchronous=normal")
            key = StorageKey("session", "s1", "turns")
            async def one(n):
                await store.append(key, canonical_messages(
                    [{{"role": "user", "content": f"{{tag}}{{n}}"}}]),
                    max_messages=None, lock_timeout=5.0)
            await asyncio.gather(*(one(n) for n in range(150)))
            await store.aclose()
        asyncio.run(main(sys.argv[1]))
    """)
    children = [subprocess.Popen([sys.executable, "-c", script, tag]) for tag in "ab"]
    for child in children:
        assert child.wait(120) == 0
    store = SQLiteStore(str(path))
    contents = [m["content"] for m in store.read(KEY)[1]]
    assert sorted(contents) == sorted(f"{t}{n}" for t in "ab" for n in range(150))
    store.close()


def test_a_stopped_holder_is_outwaited_by_busy_timeout_on_the_loop(tmp_path: Path) -> None:
    """The asyncio store's connection thread queues too: a holder frozen with SIGSTOP
    makes its append fail with StoreBusy after busy_timeout; the loop stays free."""
    path = tmp_path / "s.db"
    SQLiteStore(str(path)).close()
    holder = _holder(f"{path}.lock", WRITER)
    os.kill(holder.pid, signal.SIGSTOP)

    async def run() -> tuple[bool, int]:
        store = AsyncSQLiteStore.from_url(f"sqlite:///{path}?busy_timeout=0.3")
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        try:
            await store.append(KEY, canonical_messages([{"role": "user", "content": "x"}]),
                               max_messages=None, lock_timeout=1.0)
            refused = False
        except StoreBusy:
            refused = True
        ticker.cancel()
        await store.aclose()
        return refused, ticks

    try:
        refused, ticks = asyncio.run(run())
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    assert refused and ticks > 5
