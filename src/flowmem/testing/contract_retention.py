"""Retention on every backend that keeps expiry (the memory, SQLite, PostgreSQL, Redis stores).

Each test drives a :class:`~flowmem.Memory` over the suite's ``store`` (on the
asyncio face through :class:`~flowmem.testing.BlockingStore`) with an injected
clock, so nothing sleeps: expired data reads as absent at once, before any
sweep; a sweep deletes it (the store, asked without a clock, no longer has it)
with its idempotency records; a second sweep at the same instant finds
nothing; appends to live conversations go on while a sweep runs. A store whose
database deletes expired data itself (``native_expiry``: Redis) deletes nothing
in a sweep: there the data must read as absent at the sweep's instant. A store
without ``sweep`` skips these tests with the reason.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from ..memory import Memory
from ..scopes import ExecutionContext, StorageKey
from ..store import Store

__all__ = ["RetentionContract"]


class _Clock:
    """A clock the test moves (seconds since the epoch, starting now)."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _memory(store: Store, retention: Any, clock: _Clock) -> Memory:
    if not callable(getattr(store, "sweep", None)):
        named = type(getattr(store, "async_store", store)).__name__
        pytest.skip(f"{named} keeps no expiry (retention is refused on it)")
    memory = Memory(store, retention=retention, clock=clock)
    memory.close = lambda: None  # type: ignore[method-assign]  # the fixture closes the store
    return memory


def _native(store: Store) -> bool:
    """Whether the store's database deletes expired data itself (its sweep counts none)."""
    return bool(getattr(getattr(store, "async_store", store), "native_expiry", False))


def _context() -> ExecutionContext:
    return ExecutionContext(user_id=f"u{uuid.uuid4().hex[:12]}",
                            session_id=f"s{uuid.uuid4().hex[:12]}")


def _say(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


class RetentionContract:
    """Retention tests; mixed into :class:`~flowmem.testing.StoreContract`."""

    def test_expired_data_reads_as_absent_at_once(self, store: Store) -> None:
        clock = _Clock()
        memory = _memory(store, {"session": 60, "user": "2m"}, clock)
        ctx = _context()
        memory.append("session", "talk", _say("hi"), context=ctx)
        memory.write("user", "pref", {"x": 1}, context=ctx)
        clock.now += 59
        assert memory.history("session", "talk", context=ctx).total == 1
        assert memory.keys("session", context=ctx) == ["talk"]
        clock.now += 1  # the instant it expires: gone, before any sweep
        assert memory.history("session", "talk", context=ctx).messages == []
        assert not memory.read("session", "talk", context=ctx).found
        assert memory.keys("session", context=ctx) == []
        assert memory.history("session", "talk", context=ctx, max_tokens=1000).messages == []
        assert memory.read("user", "pref", context=ctx).found
        clock.now += 60
        assert not memory.read("user", "pref", context=ctx).found
        assert memory.keys("user", context=ctx) == []

    def test_idle_moves_with_each_append_and_absolute_does_not(self, store: Store) -> None:
        clock = _Clock()
        memory = _memory(store, {"session": 60, "user": "max_age:60"}, clock)
        ctx = _context()
        for _ in range(2):
            memory.append("session", "talk", _say("again"), context=ctx)
            memory.append("user", "log", _say("again"), context=ctx)
            clock.now += 40
        clock.now -= 20  # 60s after the first append, 20s after the last
        assert memory.history("session", "talk", context=ctx).total == 2  # idle: 20s since
        assert memory.history("user", "log", context=ctx).total == 0  # absolute: 60s old

    def test_an_append_after_expiry_starts_afresh(self, store: Store) -> None:
        clock = _Clock()
        memory = _memory(store, {"session": 60}, clock)
        ctx = _context()
        memory.append("session", "talk", _say("old"), context=ctx, idempotency_key="k1")
        clock.now += 61
        again = memory.append("session", "talk", _say("old"), context=ctx, idempotency_key="k1")
        assert not again.replayed  # the record went with the conversation
        page = memory.history("session", "talk", context=ctx)
        assert (page.total, page.messages[0]["content"]) == (1, "old")

    def test_refresh_on_read_moves_an_idle_expiry(self, store: Store) -> None:
        from ..retention import parse_retention

        clock = _Clock()
        memory = _memory(store, parse_retention({"session": 60}, refresh_on_read=True), clock)
        ctx = _context()
        memory.append("session", "talk", _say("hi"), context=ctx)
        for _ in range(3):
            clock.now += 40
            assert memory.history("session", "talk", context=ctx).total == 1

    def test_sweep_deletes_and_is_idempotent(self, store: Store) -> None:
        clock = _Clock()
        memory = _memory(store, {"session": 60, "user": 60}, clock)
        contexts = [_context() for _ in range(7)]
        for ctx in contexts:
            memory.append("session", "talk", _say("hi"), context=ctx, idempotency_key="k")
            memory.write("user", "pref", 1, context=ctx)
        clock.now += 61
        swept = memory.sweep(batch=3)
        expected = 0 if _native(store) else 7  # natively: the database deletes them itself
        assert swept.done and swept.by_scope.get("session", 0) >= expected
        assert swept.by_scope.get("user", 0) >= expected
        assert memory.sweep(batch=3).total == 0  # idempotent at the same instant
        # gone from the store itself, asked without a clock (natively: at the instant)
        now = {"now": clock.now} if _native(store) else {}
        for ctx in contexts:
            assert store.read(StorageKey("session", str(ctx.session_id), "talk"),
                              **now) == (False, None)
            assert store.read(StorageKey("user", str(ctx.user_id), "pref"),
                              **now) == (False, None)
        again = memory.append("session", "talk", _say("hi"), context=contexts[0],
                              idempotency_key="k")
        assert not again.replayed and again.count == 1

    def test_appends_to_live_conversations_go_on_during_a_sweep(self, store: Store) -> None:
        clock = _Clock()
        memory = _memory(store, {"session": 60}, clock)
        for _ in range(60):
            memory.append("session", "old", _say("x"), context=_context())
        clock.now += 61
        live = _context()
        errors: list[BaseException] = []
        appended = threading.Event()

        def append_while_sweeping() -> None:
            try:
                for number in range(30):
                    memory.append("session", "live", _say(str(number)), context=live)
                    appended.set()
            except BaseException as exc:  # reported by the test below
                errors.append(exc)
                appended.set()

        writer = threading.Thread(target=append_while_sweeping)
        writer.start()
        assert appended.wait(30)
        swept = memory.sweep(batch=5)
        writer.join(60)
        assert not errors and not writer.is_alive()
        assert swept.by_scope.get("session", 0) >= (0 if _native(store) else 60)
        assert memory.history("session", "live", context=live).total == 30
