"""Group commit of the asyncio SQLite store (#14): appends queued together share one
transaction, each still atomic, serialized (MEM-12), answered after the commit, and
failing alone; a cancelled queued append never runs, a running one commits whole.

To make a group deterministic, the connection thread is held busy by a real job
(it waits on an event) while the appends queue behind it; then it is released
and drains them in one batch. A spy records the groups the real store runs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flowmem import AsyncMemory, ExecutionContext, IdempotencyConflict, KeyConflict, Memory
from flowmem.stores.sqlite._aio import AsyncSQLiteStore
from flowmem.stores.sqlite._store import SQLiteStore

CTX = ExecutionContext(workflow_id="wf", session_id="s-1")


def _turn(call: str) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": None,
             "tool_calls": [{"id": call, "type": "function",
                             "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": call, "content": f"result of {call}"}]


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'group.db'}"


@pytest.fixture
def groups(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The size of every group the real SQLite store runs (a spy around the real method)."""
    sizes: list[int] = []
    real = SQLiteStore.append_group

    def spy(self: SQLiteStore, requests: Any) -> Any:
        sizes.append(len(requests))
        return real(self, requests)

    monkeypatch.setattr(SQLiteStore, "append_group", spy)
    yield sizes


async def _occupy(store: AsyncSQLiteStore, release: threading.Event) -> asyncio.Future[Any]:
    """Give the connection thread a job that waits for ``release``; return once it runs."""
    entered = threading.Event()

    def wait() -> None:
        entered.set()
        release.wait(30)

    busy = asyncio.ensure_future(store._call(wait))
    while not entered.is_set():  # the database opens first on that thread
        await asyncio.sleep(0.01)
    return busy


async def _behind_a_busy_thread(store: AsyncSQLiteStore,
                                calls: list[Callable[[], Awaitable[Any]]]) -> list[Any]:
    """Queue ``calls`` while the connection thread is busy, then let it drain them."""
    release = threading.Event()
    busy = await _occupy(store, release)
    tasks = [asyncio.ensure_future(call()) for call in calls]
    for _ in range(5):
        await asyncio.sleep(0)  # every task reaches the queue
    release.set()
    await busy
    return await asyncio.gather(*tasks, return_exceptions=True)


def test_queued_appends_share_one_transaction(url: str, groups: list[int]) -> None:
    """32 appends queued together: one group; every message stored once, in its
    conversation, every append serialized even where two share a key (one stripe, once)."""

    async def run() -> list[Any]:
        store = AsyncSQLiteStore.from_url(url)
        memory = AsyncMemory(store, lock_timeout=1.0)
        try:
            calls = [lambda i=i: memory.append("session", f"chat-{i % 8}", _turn(f"c{i}"),
                                               context=CTX) for i in range(32)]
            return await _behind_a_busy_thread(store, calls)
        finally:
            await memory.aclose()

    results = asyncio.run(run())
    assert groups == [32]
    assert all(r.appended == 2 and r.serialized for r in results)
    with Memory.from_url(url) as memory:
        for k in range(8):
            stored = memory.history("session", f"chat-{k}", context=CTX).messages
            assert [m["metadata"].get("tool_call_id") for m in stored if m["role"] == "tool"] \
                == [f"c{i}" for i in range(k, 32, 8)]


def test_a_refused_append_fails_alone(url: str, groups: list[int]) -> None:
    """One append refused by a rule (a key holding a value: KeyConflict; an idempotency
    key reused for another input) is rolled back to its savepoint; its neighbours commit,
    and an idempotency key repeated in the same group replays (MEM-1 holds across them)."""
    with Memory.from_url(url) as memory:
        memory.write("session", "plain", {"v": 1}, context=CTX)

    async def run() -> list[Any]:
        store = AsyncSQLiteStore.from_url(url)
        memory = AsyncMemory(store)
        try:
            def append(key: str, call: str, ikey: str | None = None) -> Callable[[], Any]:
                return lambda: memory.append("session", key, _turn(call), context=CTX,
                                             idempotency_key=ikey)
            return await _behind_a_busy_thread(store, [
                append("chat", "a"), append("plain", "b"), append("chat", "c", "k1"),
                append("chat", "c", "k1"), append("chat", "d", "k1"), append("chat", "e"),
            ])
        finally:
            await memory.aclose()

    results = asyncio.run(run())
    assert groups == [6]
    assert isinstance(results[1], KeyConflict)
    assert isinstance(results[4], IdempotencyConflict)
    assert [r.appended for r in (results[0], results[2], results[3], results[5])] == [2, 2, 2, 2]
    assert results[3].replayed and not results[2].replayed
    with Memory.from_url(url) as memory:
        stored = memory.history("session", "chat", context=CTX).messages
        assert memory.read("session", "plain", context=CTX).value == {"v": 1}
    assert [m["metadata"].get("tool_call_id") for m in stored if m["role"] == "tool"] \
        == ["a", "c", "e"]


def test_a_cancelled_queued_append_never_runs(url: str, groups: list[int]) -> None:
    """Cancelled while queued: it never runs; the others of its group commit."""

    async def run() -> None:
        store = AsyncSQLiteStore.from_url(url)
        memory = AsyncMemory(store)
        release = threading.Event()
        try:
            busy = await _occupy(store, release)
            tasks = [asyncio.ensure_future(memory.append("session", "chat", _turn(f"c{i}"),
                                                         context=CTX)) for i in range(4)]
            for _ in range(5):
                await asyncio.sleep(0)
            tasks[1].cancel()
            for _ in range(3):
                await asyncio.sleep(0)  # the cancellation reaches the queued job
            release.set()
            await busy
            done = await asyncio.gather(*tasks, return_exceptions=True)
            assert isinstance(done[1], asyncio.CancelledError)
        finally:
            await memory.aclose()

    asyncio.run(run())
    assert groups == [3]
    with Memory.from_url(url) as memory:
        stored = memory.history("session", "chat", context=CTX).messages
    assert [m["metadata"].get("tool_call_id") for m in stored if m["role"] == "tool"] \
        == ["c0", "c2", "c3"]


def test_a_running_group_commits_whole_when_cancelled(url: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancelled while its group runs: the append still commits whole, and the lock is
    free afterwards (the next append is serialized)."""
    started, release = threading.Event(), threading.Event()
    real = SQLiteStore.append_group

    def slow(self: SQLiteStore, requests: Any) -> Any:
        started.set()
        release.wait(30)
        return real(self, requests)

    monkeypatch.setattr(SQLiteStore, "append_group", slow)

    async def run() -> bool:
        store = AsyncSQLiteStore.from_url(url)
        memory = AsyncMemory(store, lock_timeout=1.0)
        try:
            gate = threading.Event()
            busy = await _occupy(store, gate)
            tasks = [asyncio.ensure_future(memory.append("session", "chat", _turn(f"c{i}"),
                                                         context=CTX)) for i in range(2)]
            for _ in range(5):
                await asyncio.sleep(0)
            gate.set()
            await busy
            await asyncio.get_running_loop().run_in_executor(None, started.wait, 30)
            tasks[0].cancel()
            release.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            after = await memory.append("session", "chat", _turn("c9"), context=CTX)
            return after.serialized
        finally:
            await memory.aclose()

    assert asyncio.run(run())
    with Memory.from_url(url) as memory:
        stored = memory.history("session", "chat", context=CTX).messages
    assert [m["metadata"].get("tool_call_id") for m in stored if m["role"] == "tool"] \
        == ["c0", "c1", "c9"]


def test_many_concurrent_tasks_lose_and_double_nothing(url: str, groups: list[int]) -> None:
    """Free-running: 32 tasks, re-fired results (MEM-1), heals (MEM-3); every conversation
    ends exactly as one-by-one appends would leave it."""

    async def worker(memory: AsyncMemory, w: int) -> None:
        for i in range(10):
            call = f"w{w}-{i}"
            await memory.append("session", f"chat-{w % 4}", _turn(call)[:1], context=CTX)
            await memory.append("session", f"chat-{w % 4}", _turn(call)[1:], context=CTX)
            await memory.append("session", f"chat-{w % 4}", _turn(call)[1:], context=CTX)

    async def run() -> None:
        memory = AsyncMemory(AsyncSQLiteStore.from_url(url))
        try:
            await asyncio.gather(*(worker(memory, w) for w in range(32)))
        finally:
            await memory.aclose()

    asyncio.run(run())
    with Memory.from_url(url) as memory:
        for k in range(4):
            stored = memory.history("session", f"chat-{k}", context=CTX).messages
            results = [m["metadata"]["tool_call_id"] for m in stored if m["role"] == "tool"]
            assert len(results) == len(set(results)) == 80
            assert not any(m["metadata"].get("healed") for m in stored)
            assert len(stored) == 160


def test_a_dropped_store_lets_its_thread_go(url: str) -> None:
    """A store dropped without aclose() does not keep its connection thread (nor itself)."""
    import gc

    def threads() -> int:
        return sum(t.name == "flowmem-sqlite" and t.is_alive() for t in threading.enumerate())

    before = threads()

    async def run() -> None:
        for _ in range(5):
            store = AsyncSQLiteStore.from_url(url)
            await store.keys("global", "")
            del store

    asyncio.run(run())
    gc.collect()
    for _ in range(200):
        if threads() <= before:
            break
        threading.Event().wait(0.01)
    assert threads() <= before
