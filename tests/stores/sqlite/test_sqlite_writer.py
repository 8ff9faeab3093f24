"""Writers of several processes on one SQLite file: SQLite's write lock and its busy
handler decide who writes next (no write turns of flowmem's own); every append is stored
once (MEM-12), and every wait is bounded by ``busy_timeout``, off the event loop."""

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
from flowmem.stores.sqlite._aio import AsyncSQLiteStore
from flowmem.stores.sqlite._store import SQLiteStore

pytestmark = pytest.mark.processes

KEY = StorageKey("session", "s1", "turns")
HOLD = textwrap.dedent("""
    import sqlite3, sys, time
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")  # SQLite's write lock, held until killed
    print("held", flush=True)
    time.sleep(60)
""")


def _holder(path: Path) -> subprocess.Popen[str]:
    """Another process holding the database's write lock (until killed)."""
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(path)],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "held"
    return process


def _append(store: SQLiteStore, text: str) -> None:
    store.append(KEY, canonical_messages([{"role": "user", "content": text}]),
                 max_messages=None, lock_timeout=5.0)


def test_a_held_write_lock_bounds_a_writer_by_busy_timeout(tmp_path: Path) -> None:
    """A process holding the write lock makes an append wait at most busy_timeout, then
    fail with StoreBusy having stored nothing; once it is gone the append goes through."""
    path = tmp_path / "b.db"
    store = SQLiteStore(str(path), busy_timeout=0.3)
    holder = _holder(path)
    try:
        start = time.monotonic()
        with pytest.raises(StoreBusy):
            _append(store, "x")
        assert time.monotonic() - start < 5.0
    finally:
        holder.kill()
        holder.wait()
    _append(store, "y")
    assert [m["content"] for m in store.read(KEY)[1]] == ["y"]
    store.close()


def test_two_processes_store_every_append_once(tmp_path: Path) -> None:
    """MEM-12: two processes, each an asyncio store appending concurrently to one
    conversation; every append stored exactly once, both served."""
    path = tmp_path / "t.db"
    script = textwrap.dedent(f"""
        import asyncio, sys
        from flowmem.messages import canonical_messages
        from flowmem.scopes import StorageKey
        from flowmem.stores.sqlite._aio import AsyncSQLiteStore
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
    """The asyncio store waits on its connection thread: a holder of the write lock frozen
    with SIGSTOP makes its append fail with StoreBusy after busy_timeout; the loop stays
    free."""
    path = tmp_path / "s.db"
    SQLiteStore(str(path)).close()
    holder = _holder(path)
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
