"""FlowmemSession against the OpenAI Agents SDK's documented ``Session`` behaviour.

Written by us from the SDK's ``Session`` protocol and its own session tests
(``tests/test_session.py``, ``tests/extensions/memory/test_encrypt_session.py``),
whose names each test cites. The SDK's sessions are the reference: one session
object usable from any event loop and thread, ``session_settings`` validated
and defaulted as theirs, ``get_items(limit)`` the latest ``limit`` items in
order, ``pop_item`` newest first, ``clear_session`` empties.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from agents.memory import SessionSettings

import flowmem
from flowmem.integrations.agents import FlowmemSession

URLS = ("sqlite", "memory")


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


@pytest.fixture(params=URLS)
def memory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[flowmem.AsyncMemory]:
    url = f"sqlite:///{tmp_path / 'agents.db'}" if request.param == "sqlite" else "memory://"
    opened = flowmem.AsyncMemory.from_url(url)
    yield opened
    asyncio.run(opened.aclose())


def on_own_loop(coro: Any) -> Any:
    """Run ``coro`` on a fresh event loop of this thread, as the SDK test's workers do."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(asyncio.wait_for(coro, 30))
    finally:
        loop.close()


# -- one session, many loops and threads --------------------------------------

def test_add_items_from_threads_each_with_its_own_loop(memory: flowmem.AsyncMemory) -> None:
    """SDK ``test_sqlite_session_concurrent_access``: 10 ``add_items`` from 5 threads,
    each on its own event loop, against ONE session object: all return, none is
    lost (each store append is atomic per conversation, MEM-12)."""
    session = FlowmemSession("concurrent", memory)
    items = [user(f"Message {i}") for i in range(10)]

    def add(item: dict[str, Any]) -> None:
        on_own_loop(session.add_items([item]))

    with concurrent.futures.ThreadPoolExecutor(max_workers=5) as pool:
        list(pool.map(add, items))  # re-raises the first failure
    stored = asyncio.run(session.get_items())
    assert sorted(i["content"] for i in stored) == sorted(i["content"] for i in items)


def test_every_method_from_threads_each_with_its_own_loop(
        memory: flowmem.AsyncMemory) -> None:
    """A session first used on one loop keeps working on others: add, read, pop
    and clear interleaved across threads (no loop-bound state in the session)."""
    session = FlowmemSession("loops", memory)
    asyncio.run(session.add_items([user("first")]))  # binds nothing to this loop

    def work(n: int) -> Any:
        async def go() -> Any:
            await session.add_items([user(f"m{n}")])
            await session.get_items(2)
            return await session.pop_item()
        return on_own_loop(go())

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        popped = list(pool.map(work, range(8)))
    left = asyncio.run(session.get_items())
    assert all(p is not None for p in popped)
    assert sorted(i["content"] for i in left + popped) == sorted(
        ["first", *(f"m{n}" for n in range(8))])
    on_own_loop(session.clear_session())
    assert asyncio.run(session.get_items()) == []


# -- session_settings ----------------------------------------------------------

def test_settings_default_to_session_settings(memory: flowmem.AsyncMemory) -> None:
    """As ``SQLiteSession(session_settings=None)``: "uses default SessionSettings()"."""
    assert FlowmemSession("s", memory).session_settings == SessionSettings()


def test_settings_dictionary_is_normalized(memory: flowmem.AsyncMemory) -> None:
    """SDK ``test_session_settings_constructor_normalizes_dictionary``."""
    session = FlowmemSession("s", memory, session_settings={"limit": 0})
    assert isinstance(session.session_settings, SessionSettings)
    assert session.session_settings.limit == 0


@pytest.mark.parametrize("given", [{"limitt": 1}, {"limit": 1, "other": 2}, 5, "limit=1"])
def test_settings_refuse_what_the_sdk_refuses(memory: flowmem.AsyncMemory, given: Any) -> None:
    """SDK ``test_session_settings_rejects_unknown_dictionary_fields``: a misspelt
    field is a ``TypeError``, never a silent ``limit=None``."""
    with pytest.raises(TypeError):
        FlowmemSession("s", memory, session_settings=given)


def test_settings_limit_is_the_default_limit(memory: flowmem.AsyncMemory) -> None:
    """SDK ``test_get_items_uses_session_settings_limit``."""
    session = FlowmemSession("s", memory, session_settings=SessionSettings(limit=3))

    async def go() -> None:
        await session.add_items([user(f"Message {i}") for i in range(5)])
        assert [i["content"] for i in await session.get_items()] == \
            ["Message 2", "Message 3", "Message 4"]

    asyncio.run(go())


def test_settings_assigned_later_are_validated_and_used(memory: flowmem.AsyncMemory) -> None:
    """SDK ``test_session_settings_get_items_uses_underlying_limit`` and
    ``test_session_settings_explicit_limit_overrides_settings``: a wrapper session
    (``EncryptedSession``) assigns ``session_settings`` on the session it wraps;
    an explicit ``limit`` wins over the settings' one."""
    session = FlowmemSession("s", memory)

    async def go() -> None:
        await session.add_items([user(f"Message {i}") for i in range(5)])
        session.session_settings = {"limit": 3}
        assert [i["content"] for i in await session.get_items()] == \
            ["Message 2", "Message 3", "Message 4"]
        assert len(await session.get_items(limit=4)) == 4
        session.session_settings = None
        assert len(await session.get_items()) == 5

    asyncio.run(go())
    with pytest.raises(TypeError):
        session.session_settings = {"limitt": 1}


# -- get_items, pop_item, clear_session -----------------------------------------

def test_direct_add_get_clear(memory: flowmem.AsyncMemory) -> None:
    """SDK ``test_sqlite_session_memory_direct``: items in, the same items out,
    nothing after ``clear_session`` (and clearing an empty session is fine)."""
    session = FlowmemSession("direct", memory)
    items = [user("Hello"), {"role": "assistant", "content": "Hi there!"},
             user("O'Reilly\"; DROP TABLE sessions;--")]

    async def go() -> None:
        await session.add_items(items)
        await session.add_items([])  # nothing to add: nothing happens
        assert await session.get_items() == items
        await session.clear_session()
        assert await session.get_items() == []
        await session.clear_session()

    asyncio.run(go())


def test_get_items_with_limit(memory: flowmem.AsyncMemory) -> None:
    """SDK ``test_sqlite_session_get_items_with_limit``: the latest ``limit`` items in
    chronological order; 0 gives none; more than stored gives all."""
    session = FlowmemSession("limit", memory)
    items = [user(f"Message {i}") for i in range(5)]

    async def go() -> None:
        await session.add_items(items)
        assert await session.get_items(limit=2) == items[3:]
        assert await session.get_items(limit=0) == []
        assert await session.get_items(limit=10) == items
        assert await session.get_items(limit=None) == items

    asyncio.run(go())


def test_pop_item_newest_first_then_none(memory: flowmem.AsyncMemory) -> None:
    """SDK ``test_sqlite_session_memory_pop_item``: ``None`` when empty, then the
    newest item each time, the history shrinking with it."""
    session = FlowmemSession("pop", memory)
    items = [user("Hello"), {"role": "assistant", "content": "Hi there!"}, user("How are you?")]

    async def go() -> None:
        assert await session.pop_item() is None
        await session.add_items(items)
        for left in (2, 1, 0):
            assert await session.pop_item() == items[left]
            assert await session.get_items() == items[:left]
        assert await session.pop_item() is None

    asyncio.run(go())


def test_pop_item_touches_only_its_session(memory: flowmem.AsyncMemory) -> None:
    """SDK ``test_session_memory_pop_different_sessions``."""
    one, two = FlowmemSession("one", memory), FlowmemSession("two", memory)

    async def go() -> None:
        await one.add_items([user("Session 1 message")])
        await two.add_items([user("Session 2 message 1"), user("Session 2 message 2")])
        assert await two.pop_item() == user("Session 2 message 2")
        assert await one.get_items() == [user("Session 1 message")]
        assert await two.get_items() == [user("Session 2 message 1")]

    asyncio.run(go())


def test_the_sdk_drops_an_open_call_the_store_heals_it(memory: flowmem.AsyncMemory) -> None:
    """Differs by design: a ``function_call`` left without output is healed when the
    next user item is stored (MEM-3), so ``get_items`` then holds an output the
    SDK never wrote; a re-fired output is stored once (MEM-1)."""
    session = FlowmemSession("heal", memory)
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "ok"}

    async def go() -> list[Any]:
        await session.add_items([user("a"), call])
        await session.add_items([user("b")])
        await session.add_items([output, output])  # late and re-fired: replaces (MEM-10)
        items: list[Any] = await session.get_items()
        return items

    items = asyncio.run(go())
    assert items == [user("a"), call, output, user("b")]
