"""AsyncMemory (#12): the same surface, results, refusals and errors as Memory,
on every backend; MEM-12 across faces; cancellation safety.

The two faces share one coordinator (flowmem.coordinator), so these tests
check what could still differ: the I/O each face does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import threading
from pathlib import Path
from typing import Any

import pytest

from backends import BACKENDS, Backend, make_backend, unavailable
from flowmem import (
    AsyncMemory,
    ExecutionContext,
    InvalidInput,
    KeyConflict,
    Memory,
    MessagesNotLoaded,
)
from flowmem.buffer import append as model_append
from flowmem.messages import canonical_messages
from flowmem.stores import open_async_store

USER = ExecutionContext(user_id="u-1", workflow_id="wf", node_id="n")
ANON = ExecutionContext(user_id=0, workflow_id="wf", node_id="n")


def _async_backends() -> list[str]:
    import importlib.util

    present = importlib.util.find_spec("flowmem.stores.redis._aio") is not None
    return [name for name in BACKENDS if name != "redis" or present]


@pytest.fixture(params=_async_backends())
def both(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    reason = unavailable(request.param)
    if reason:
        pytest.skip(reason)
    return make_backend(request.param, tmp_path)


def _turns(tag: str) -> list[list[dict[str, Any]]]:
    call = {"id": f"{tag}-c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    return [
        [{"role": "user", "content": "hi"}],
        [{"role": "assistant", "content": None, "tool_calls": [call]}],
        [{"role": "tool", "tool_call_id": f"{tag}-c", "content": "r"}],
        [{"role": "tool", "tool_call_id": f"{tag}-c", "content": "r again"}],  # MEM-1
        [{"role": "assistant", "content": None, "tool_calls": [{**call, "id": f"{tag}-d"}]}],
        [{"role": "user", "content": "next"}],  # MEM-3 heals d
        [{"role": "tool", "tool_call_id": f"{tag}-d", "content": "late"}],  # MEM-10
    ]


def _script(memory: Memory, tag: str) -> list[Any]:
    """Every operation once, and their results as plain data."""
    out: list[Any] = []
    for turn in _turns(tag):
        r = memory.append("user", f"{tag}-conv", turn, context=USER, max_messages=50)
        out.append((r.count, r.appended, r.appended_any, r.refused, r.resolved_scope_id,
                    r.messages))
    out.append(memory.history("user", f"{tag}-conv", context=USER, last=3))
    out.append(memory.write("workflow", f"{tag}-v", {"a": [1, 2]}, context=USER))
    out.append(memory.read("workflow", f"{tag}-v", context=USER))
    out.append(memory.keys("workflow", context=USER, prefix=f"{tag}-"))
    out.append(memory.read("user", f"{tag}-conv", context=ANON, default="d"))  # MEM-6/7
    out.append(memory.append("user", "x", {"role": "user", "content": "x"}, context=ANON)
               .to_dict())
    out.append(memory.delete("workflow", f"{tag}-v", context=USER))
    out.append(memory.delete("workflow", f"{tag}-v", context=USER))
    return out


async def _ascript(memory: AsyncMemory, tag: str) -> list[Any]:
    out: list[Any] = []
    for turn in _turns(tag):
        r = await memory.append("user", f"{tag}-conv", turn, context=USER, max_messages=50)
        out.append((r.count, r.appended, r.appended_any, r.refused, r.resolved_scope_id,
                    await r.load_messages()))
    out.append(await memory.history("user", f"{tag}-conv", context=USER, last=3))
    out.append(await memory.write("workflow", f"{tag}-v", {"a": [1, 2]}, context=USER))
    out.append(await memory.read("workflow", f"{tag}-v", context=USER))
    out.append(await memory.keys("workflow", context=USER, prefix=f"{tag}-"))
    out.append(await memory.read("user", f"{tag}-conv", context=ANON, default="d"))
    out.append((await memory.append("user", "x", {"role": "user", "content": "x"},
                                    context=ANON)).to_dict())
    out.append(await memory.delete("workflow", f"{tag}-v", context=USER))
    out.append(await memory.delete("workflow", f"{tag}-v", context=USER))
    return out


def test_both_faces_give_the_same_results(both: Backend,
                                          caplog: pytest.LogCaptureFixture) -> None:
    """MEM-1/3/6/7/10/14 through both faces: identical results and warnings."""
    tag = f"p{random.randrange(10**9)}"
    with caplog.at_level(logging.WARNING, logger="flowmem"):
        with Memory.from_url(both.url) as memory:
            blocking = _script(memory, tag + "s")
        warned = len(caplog.records)

        async def run() -> list[Any]:
            async with AsyncMemory.from_url(both.url) as memory:
                return await _ascript(memory, tag + "s")

        if both.persistent:  # same data: run the async face on its own keys
            tag_async = tag + "a"

            async def run_fresh() -> list[Any]:
                async with AsyncMemory.from_url(both.url) as memory:
                    return await _ascript(memory, tag_async)

            asynced = asyncio.run(run_fresh())
            blocking = _replace_tag(blocking, tag + "s", tag_async)
        else:
            asynced = asyncio.run(run())
    assert _replace_tag(asynced, "-", "-") == _replace_tag(blocking, "-", "-")
    assert len(caplog.records) == 2 * warned == 4  # one warning per refusal, each face (MEM-7)


def _replace_tag(value: Any, old: str, new: str) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, list):
        return [_replace_tag(v, old, new) for v in value]
    if isinstance(value, tuple):
        return tuple(_replace_tag(v, old, new) for v in value)
    if isinstance(value, dict):
        return {k: _replace_tag(v, old, new) for k, v in value.items()}
    return value


def test_async_errors_are_the_blocking_ones(tmp_path: Path) -> None:
    async def run() -> None:
        async with AsyncMemory.from_url(f"sqlite:///{tmp_path / 'e.db'}") as memory:
            with pytest.raises(InvalidInput):
                await memory.append("user", "", {"role": "user", "content": "x"}, context=USER)
            with pytest.raises(InvalidInput):
                await memory.history("user", "k", context=USER, last=True)  # type: ignore[arg-type]
            await memory.write("workflow", "v", 1, context=USER)
            with pytest.raises(KeyConflict):
                await memory.append("workflow", "v", {"role": "user", "content": "x"},
                                    context=USER)
            result = await memory.append("workflow", "c", {"role": "user", "content": "x"},
                                         context=USER)
            with pytest.raises(MessagesNotLoaded):
                _ = result.messages
            assert [m["content"] for m in await result.load_messages()] == ["x"]
            assert result.messages == await result.load_messages()

    asyncio.run(run())


def test_mem12_blocking_and_async_writers_serialize(both: Backend) -> None:
    """MEM-12 across faces: a blocking writer thread and async tasks on one conversation
    lose nothing and double nothing."""
    if both.name == "memory":
        pytest.skip("memory:// stores are private to their Memory")
    key, per = f"x{random.randrange(10**9)}", 30

    def blocking() -> None:
        with Memory.from_url(both.url) as memory:
            for i in range(per):
                memory.append("workflow", key, _pair(f"b{i}"), context=USER)
                memory.append("workflow", key, _pair(f"b{i}")[1:], context=USER)  # re-fire

    async def writer(memory: AsyncMemory, name: str) -> None:
        for i in range(per):
            await memory.append("workflow", key, _pair(f"{name}{i}"), context=USER)
            await memory.append("workflow", key, _pair(f"{name}{i}")[1:], context=USER)

    async def run() -> list[dict[str, Any]]:
        async with AsyncMemory.from_url(both.url) as memory:
            await asyncio.gather(*(writer(memory, f"a{n}") for n in range(3)))
            return (await memory.history("workflow", key, context=USER)).messages

    thread = threading.Thread(target=blocking)
    thread.start()
    stored = asyncio.run(run())
    thread.join()
    with Memory.from_url(both.url) as memory:
        stored = memory.history("workflow", key, context=USER).messages
    results = [m["metadata"]["tool_call_id"] for m in stored if m["role"] == "tool"]
    assert len(results) == len(set(results)) == 4 * per
    assert len(stored) == 2 * 4 * per


def _pair(call: str) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": None,
             "tool_calls": [{"id": call, "type": "function",
                             "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": call, "content": "r"}]


def test_cancelled_appends_are_whole_or_absent(both: Backend) -> None:
    """Cancellation safety: an append cancelled at a random await point either
    committed whole or not at all, and leaves no lock held (the next append is
    serialized within a short lock wait)."""
    rounds = 120 if both.name != "memory" else 60
    rng = random.Random(12)
    key = f"cancel{random.randrange(10**9)}"

    async def run() -> tuple[int, int]:
        store = open_async_store(both.url)
        memory = AsyncMemory(store, lock_timeout=2.0)
        model: list[dict[str, Any]] = []
        cancelled = 0
        try:
            for i in range(rounds):
                turn = rng.choice([_pair(f"k{i}"), [{"role": "user", "content": f"u{i}"}],
                                   _pair(f"k{max(i - 1, 0)}")[1:]])
                task = asyncio.ensure_future(
                    memory.append("workflow", key, turn, context=USER))
                for _ in range(rng.randrange(0, 12)):
                    await asyncio.sleep(0)
                if rng.random() < 0.5:
                    await asyncio.sleep(rng.uniform(0, 0.004))
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    cancelled += 1
                stored = (await memory.history("workflow", key, context=USER)).messages
                after = model_append(model, canonical_messages(turn)).messages
                assert stored in (model, after), f"round {i}: a partial append"
                model = stored
                probe = await memory.append("workflow", key + "-probe",
                                            {"role": "system", "content": "p"}, context=USER)
                assert probe.serialized
                held = store.lock(_where(key), 0.5)
                async with held as had:
                    assert had, f"round {i}: a cancelled append left its lock held"
            return cancelled, rounds
        finally:
            await memory.aclose()

    cancelled, total = asyncio.run(run())
    assert 0 < cancelled <= total


def _where(key: str) -> Any:
    from flowmem.scopes import StorageKey

    return StorageKey("workflow", "wf", key)


def test_pop_removes_exactly_the_newest_entry_on_both_faces(both: Backend) -> None:
    """pop (for the Agents SDK's pop_item): the newest entry, then the one before; the
    buffer stays consistent (MEM-15: an administrative edit, see Memory.pop)."""
    key = f"pop{random.randrange(10**9)}"
    turn = [{"role": "user", "content": "q"}, *_pair("p1"), {"role": "assistant", "content": "a"}]
    with Memory.from_url(both.url) as memory:
        memory.append("workflow", key, turn, context=USER)
        assert memory.pop("workflow", key, context=USER)["content"] == "a"  # type: ignore[index]
        assert memory.pop("workflow", key, context=USER)["role"] == "tool"  # type: ignore[index]

    async def run() -> list[Any]:
        async with AsyncMemory.from_url(both.url) as memory:
            if both.name == "memory":
                await memory.append("workflow", key, turn[:3], context=USER)
                await memory.pop("workflow", key, context=USER)
            popped = await memory.pop("workflow", key, context=USER)
            assert popped is not None and popped["role"] == "assistant"
            left = (await memory.history("workflow", key, context=USER)).messages
            assert await memory.pop("workflow", key + "-none", context=USER) is None
            assert await memory.pop("user", key, context=ANON) is None  # MEM-7: refused
            return left

    assert [m["content"] for m in asyncio.run(run())] == ["q"]


def test_a_lock_waiter_never_blocks_the_holder_on_sqlite(tmp_path: Path) -> None:
    """MEM-12 on the asyncio SQLite store: a task waiting for a key's lock waits on the
    loop, not on the store's one connection thread, so the holder's own calls go on."""
    from flowmem.scopes import StorageKey

    order: list[str] = []

    async def run() -> None:
        store = open_async_store(f"sqlite:///{tmp_path / 'l.db'}")
        key = StorageKey("workflow", "w", "k")

        async def waiter() -> None:
            async with store.lock(key, 30.0) as had:
                order.append(f"waiter had={had}")

        async with store.lock(key, 1.0) as had:
            assert had
            task = asyncio.create_task(waiter())
            await asyncio.sleep(0.05)
            await store.write(StorageKey("workflow", "w", "v"), 1)  # would queue behind a waiter
            order.append("holder wrote")
        await task
        await store.aclose()

    asyncio.run(run())
    assert order == ["holder wrote", "waiter had=True"]


def test_an_append_answers_its_tail_on_both_faces(both: Backend) -> None:
    """``tail=N``: the newest N entries the append left, as a HistoryResult of the same
    scope, on both faces; a refused append's tail is an empty refused page (MEM-7);
    ``tail`` is None or a positive integer."""
    turns = [[{"role": "user", "content": f"m{i}"}] for i in range(4)]
    with Memory(both.open()) as memory:
        for turn in turns:
            result = memory.append("user", "tail", turn, context=USER, tail=2)
        page = memory.history("user", "tail", context=USER, last=2)
        assert result.tail == page and result.tail is not None
        assert (result.tail.scope, result.tail.resolved_scope_id) == ("user", "u-1")
        assert memory.append("user", "tail", turns[0], context=USER).tail is None
        refused = memory.append("user", "tail", turns[0], context=ANON, tail=2)
        assert refused.refused and refused.tail is not None and refused.tail.refused
        for bad in (0, -1, True, "2", 2.0):
            with pytest.raises(InvalidInput, match="tail"):
                memory.append("user", "tail", turns[0], context=USER, tail=bad)

    async def run() -> Any:
        async with AsyncMemory(open_async_store(both.url)) as memory:
            result = await memory.append("user", "tail", turns[1], context=USER, tail=3)
            assert result.tail == await memory.history("user", "tail", context=USER, last=3)
            return result.tail

    tail = asyncio.run(run())
    assert [m["content"] for m in tail.messages][-1] == "m1"
