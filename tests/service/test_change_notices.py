"""Change notices between serving processes (service/_changes.py, stores/_notices.py):
on PostgreSQL (LISTEN/NOTIFY) and standalone Redis (pub/sub) a process follows the
store's notices instead of reading the shared changes record per request. An
announcement made through ANOTHER store instance empties this one's caches; while the
feed is connected serving reads nothing; a dropped LISTEN connection is reconnected
and the reconnection forgets everything cached. Waits for conditions, never a time.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from backends import REDIS_URL, unavailable, with_option
from flowmem.service._changes import Changes, announce
from flowmem.stores import open_async_store
from flowmem.stores.postgres._notices import channel_of
from postgres_support import admin, throwaway_schema

CONDITION_BOUND = 30.0  # seconds a condition may take to come true before the test fails


async def _until(condition: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CONDITION_BOUND
    while not condition():
        assert loop.time() < deadline, f"never true: {what}"
        await asyncio.sleep(0.01)


async def _notices_reach_another_process(url: str,
                                         drop: Callable[[], Awaitable[None]] | None) -> None:
    here, there = open_async_store(url), open_async_store(url)
    try:
        changes = Changes(here)
        await changes.settle()
        await _until(lambda: changes.live, "the feed connects")

        async def refuse(*_: Any) -> Any:
            raise AssertionError("a store read while the notice feed is connected")

        reading = here.read
        here.read = refuse  # type: ignore[method-assign]
        for _ in range(3):  # served with no store read
            await changes.settle()
        here.read = reading  # type: ignore[method-assign]

        changes.tokens.put("t", 1, changes.tokens.epoch)
        await announce(there)  # another process's change
        await _until(lambda: changes.tokens.get("t") is None, "the notice empties the cache")
        if drop is not None:
            changes.sessions.put("s", 1, changes.sessions.epoch)
            await drop()
            await _until(lambda: changes.sessions.get("s") is None,
                         "a reconnection forgets what was kept")
            await _until(lambda: changes.live, "the feed reconnects")
            changes.tokens.put("t", 2, changes.tokens.epoch)
            await announce(there)
            await _until(lambda: changes.tokens.get("t") is None, "notices flow again")
        await changes.aclose()
    finally:
        await here.aclose()
        await there.aclose()


@pytest.mark.postgres
@pytest.mark.skipif(unavailable("postgres") is not None, reason=unavailable("postgres") or "")
def test_postgres_notices_replace_the_read_per_request_and_survive_a_dropped_listener(
        ) -> None:
    with throwaway_schema("notices") as (url, schema):
        async def drop() -> None:
            with admin() as conn:
                conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                             "WHERE query = %s", (f'LISTEN "{channel_of(schema)}"',))

        asyncio.run(_notices_reach_another_process(url, drop))


@pytest.mark.redis
@pytest.mark.skipif(unavailable("redis") is not None, reason=unavailable("redis") or "")
def test_redis_notices_replace_the_read_per_request() -> None:
    url = with_option(REDIS_URL, "prefix", f"fmnotice_{uuid.uuid4().hex[:8]}")
    asyncio.run(_notices_reach_another_process(url, None))
