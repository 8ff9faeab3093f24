"""Service sessions expire with their conversations, on every backend and on the memory's
injected clock (nothing sleeps): a session whose transcript still lives is never lost; once
its transcript reads as absent and its record went the policy's time unchanged, it loads
as unknown and leaves every listing at once; the sweep then deletes its record and its
owner and viewer entries (a second sweep finds nothing)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import pytest

from backends import Backend
from flowmem import AsyncMemory
from flowmem.metrics import Metrics
from flowmem.service import TRANSCRIPT_KEY, SessionRegistry, session_context
from flowmem.service._registry import RESERVED_SCOPE
from flowmem.service._sweeper import sweep_once


def _say(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


async def _expire_with_conversations(url: str) -> None:
    now = [time.time()]
    memory = AsyncMemory.from_url(url, retention={"session": 60}, clock=lambda: now[0])
    registry = SessionRegistry(memory.store, retention=memory.retention, clock=memory.clock)
    owner, viewer = f"o{uuid.uuid4().hex[:10]}", f"v{uuid.uuid4().hex[:10]}"
    try:
        used = await registry.create(owner, "used")
        unused = await registry.create(owner, "never used")
        await registry.grant(used.id, viewer)
        await memory.append("session", TRANSCRIPT_KEY, _say("hi"), context=session_context(used))
        now[0] += 40  # a turn the registry is not told of: the record stays 40 s old
        await memory.append("session", TRANSCRIPT_KEY, _say("again"),
                            context=session_context(used))
        now[0] += 30  # both records' time has passed; only one transcript lives (until +100)
        assert await registry.load(unused.id) is None  # no transcript: expired
        assert (await registry.load(used.id)) is not None  # its transcript lives
        mine, _ = await registry.listing(owner, "owner", offset=0, limit=10)
        assert [r.id for r in mine] == [used.id]
        now[0] += 30  # +100: the transcript expired too
        assert await registry.load(used.id) is None
        assert (await registry.listing(viewer, "viewer", offset=0, limit=10))[0] == []
        assert await registry.sweep(batch=1) == 2
        store = memory.store
        for scope_id in ("sessions", f"owner/{owner}", f"viewer/{viewer}"):
            left = await store.keys(RESERVED_SCOPE, scope_id, limit=1000)
            assert not {used.id, unused.id} & set(left), scope_id
        assert await registry.sweep() == 0
    finally:
        await memory.aclose()


def test_sessions_expire_with_their_conversations(backend: Backend) -> None:
    asyncio.run(_expire_with_conversations(backend.url))


def test_a_turn_keeps_an_active_session_fresh_and_no_policy_keeps_it() -> None:
    async def scenario() -> None:
        now = [time.time()]
        memory = AsyncMemory.from_url("memory://", retention={"session": 60, "user": 60},
                                      clock=lambda: now[0])
        registry = SessionRegistry(memory.store, retention=memory.retention,
                                   clock=memory.clock)
        kept = SessionRegistry(memory.store)  # no policy: never expires a session
        record = await registry.create("alice", "t")
        for _ in range(4):  # a turn every 35 s: the record moves every half policy
            await memory.append("session", TRANSCRIPT_KEY, _say("x"),
                                context=session_context(record))
            record = await registry.turn_finished(record)
            now[0] += 35
        assert record.updated_at >= now[0] - 35 - 30
        now[0] += 3600
        assert await registry.load(record.id) is None
        assert await kept.load(record.id) is not None
        await memory.aclose()

    asyncio.run(scenario())


def test_the_background_sweep_counts_session_records(
        caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        now = [time.time()]
        memory = AsyncMemory.from_url("memory://", retention={"session": 60},
                                      metrics=Metrics(), clock=lambda: now[0])
        registry = SessionRegistry(memory.store, retention=memory.retention,
                                   clock=memory.clock)
        for number in range(3):
            record = await registry.create(f"u{number}", "t")
            await memory.append("session", TRANSCRIPT_KEY, _say("secret words"),
                                context=session_context(record))
        now[0] += 61
        swept = await sweep_once(memory, batch=2, sessions=registry)
        assert swept.by_scope == {"session": 3, "session_record": 3}
        await memory.aclose()

    with caplog.at_level(logging.INFO, logger="flowmem"):
        asyncio.run(scenario())
    lines = [r.getMessage() for r in caplog.records if "sweep deleted" in r.getMessage()]
    assert any("session_record=3" in line for line in lines), lines
    assert not any("secret" in r.getMessage() for r in caplog.records)
