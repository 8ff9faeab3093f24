"""Retention on Redis beyond the shared contract: every key of a conversation carries the
one expiry instant (in its slot, set by the writing script), an edit keeps it, and Redis
itself deletes the keys once its clock passes it (a short real TTL, waited for by polling
a condition with a bound); the scope index then stops listing the key and is pruned."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from backends import unavailable
from flowmem import ExecutionContext, Memory, StorageKey
from flowmem.retention import Expiry
from flowmem.stores.redis._keys import key_names
from flowmem.stores.redis._store import RedisStore
from redis_support import raw_client

pytestmark = pytest.mark.skipif(unavailable("redis") is not None,
                                reason=unavailable("redis") or "")

DATA_PARTS = 8
"""The keys of a conversation's data (``:v`` .. ``:pend``; not the lease)."""


def wait_until(condition: Callable[[], bool], bound: float = 10.0) -> bool:
    """Poll ``condition`` until it holds or ``bound`` seconds passed; whether it held."""
    deadline = time.monotonic() + bound
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def expiries(client: Any, store: RedisStore, key: StorageKey) -> dict[bytes, int]:
    """``PEXPIRETIME`` of every data key of ``key`` that exists."""
    names = key_names(store.prefix.encode(), key)
    found = {part: client.pexpiretime(part) for part in names.keys[:DATA_PARTS]}
    return {part: at for part, at in found.items() if at != -2}


def _ms(instant: float) -> int:
    return math.floor(instant * 1000)


def _exchange(call: str) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": None, "tool_calls": [
                {"id": call, "type": "function",
                 "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": call, "content": "ok"}]


def test_every_key_carries_the_one_instant_idle_moves_it_absolute_keeps_it(
        store: RedisStore) -> None:
    now = [time.time()]
    memory = Memory(store, retention={"session": 60, "user": "max_age:60"},
                    clock=lambda: now[0])
    ctx = ExecutionContext(user_id=f"u{uuid.uuid4().hex}", session_id=f"s{uuid.uuid4().hex}")
    client = raw_client()
    try:
        memory.append("session", "talk", _exchange("c1"), context=ctx, idempotency_key="k")
        memory.append("user", "log", {"role": "user", "content": "hi"}, context=ctx)
        session = StorageKey("session", str(ctx.session_id), "talk")
        user = StorageKey("user", str(ctx.user_id), "log")
        first = _ms(now[0] + 60)
        assert set(expiries(client, store, session).values()) == {first}
        assert len(expiries(client, store, session)) >= 6  # meta, pos, body, info, res, calls
        lease = key_names(store.prefix.encode(), session).lock
        assert client.pexpiretime(lease) == -2  # the lease keeps its own PX
        now[0] += 30
        memory.append("session", "talk", {"role": "user", "content": "again"}, context=ctx)
        memory.append("user", "log", _exchange("c2"), context=ctx)  # creates info, res, calls
        assert set(expiries(client, store, session).values()) == {_ms(now[0] + 60)}  # idle
        assert set(expiries(client, store, user).values()) == {first}  # absolute: kept
        assert len(expiries(client, store, user)) >= 6
        # an edit (MEM-15) rewrites the index keys and keeps the instant
        assert store.edit(user, 0, {"role": "user", "content": "edited"})
        assert set(expiries(client, store, user).values()) == {first}
        # refresh_on_read's touch moves every key
        assert store.touch(session, Expiry(now[0], now[0] + 600, True))
        assert set(expiries(client, store, session).values()) == {_ms(now[0] + 600)}
    finally:
        client.close()


def test_redis_deletes_the_keys_itself_and_the_index_stops_listing_them(
        store: RedisStore) -> None:
    memory = Memory(store, retention={"session": 2.0, "user": 2.0})  # the real clock
    ctx = ExecutionContext(user_id=f"u{uuid.uuid4().hex}", session_id=f"s{uuid.uuid4().hex}")
    client = raw_client()
    try:
        started = time.monotonic()
        memory.append("session", "talk", _exchange("c1"), context=ctx)
        memory.write("user", "pref", {"x": 1}, context=ctx)
        session = StorageKey("session", str(ctx.session_id), "talk")
        user = StorageKey("user", str(ctx.user_id), "pref")
        names = key_names(store.prefix.encode(), session)
        listed = memory.keys("session", context=ctx)
        if time.monotonic() - started < 2.0:  # a stalled machine may outlive the retention
            assert listed == ["talk"]
        assert memory.sweep().total == 0  # nothing for a sweep: Redis deletes them

        def gone() -> bool:
            return client.exists(*names.keys[:DATA_PARTS],
                                 *key_names(store.prefix.encode(), user).keys[:1]) == 0

        assert wait_until(gone), "Redis did not expire the keys within the bound"
        assert client.zscore(names.index, names.member) is not None  # listed until looked at
        assert memory.keys("session", context=ctx) == []
        assert client.zscore(names.index, names.member) is None  # pruned by that listing
        assert memory.keys("user", context=ctx) == []
        assert not memory.read("user", "pref", context=ctx).found
    finally:
        client.close()


def test_an_expired_key_is_hidden_from_the_listing_before_redis_deletes_it(
        store: RedisStore) -> None:
    now = [time.time()]
    memory = Memory(store, retention={"session": 60}, clock=lambda: now[0])
    ctx = ExecutionContext(session_id=f"s{uuid.uuid4().hex}")
    for name in ("a", "b", "c"):
        memory.append("session", name, {"role": "user", "content": name}, context=ctx)
        now[0] += 20
    # a expired at +60, b at +80: at +60 only b and c are listed; the keys are still there
    assert memory.keys("session", context=ctx) == ["b", "c"]
    assert store.keys("session", str(ctx.session_id)) == ["a", "b", "c"]  # no clock: all
    memory.append("session", "a", {"role": "user", "content": "anew"}, context=ctx)
    assert memory.keys("session", context=ctx) == ["a", "b", "c"]
    assert memory.history("session", "a", context=ctx).total == 1  # started afresh
