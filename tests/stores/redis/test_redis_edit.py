"""MEM-15 on Redis: the administrative edit is a version-checked rewrite, on both faces.

The edit reads the entries and the version in one MULTI, edits and derives
the indexes in Python, and writes back with the ``EDIT`` script only if the
version is unchanged. An unserialized append that lands in between (it does
not wait for the edit's lock) makes the edit read and compute again: both
the append and the edit survive, and the buffer's indexes stay right (the
next appends heal and de-duplicate exactly as the pure model does).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from backends import unavailable
from flowmem import StorageKey
from flowmem.buffer import append as model_append
from flowmem.messages import Message, canonical_messages
from flowmem.stores.redis._aio import AsyncRedisStore
from flowmem.stores.redis._store import RedisStore
from redis_support import url_with

pytestmark = pytest.mark.skipif(unavailable("redis") is not None,
                                reason=unavailable("redis") or "")

START = [{"role": "user", "content": "q"},
         {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}, {"id": "c2"}]},
         {"role": "tool", "tool_call_id": "c1", "content": "first"}]


@pytest.mark.parametrize("face", ["sync", "async"])
def test_mem15_an_append_between_read_and_script_makes_the_edit_compute_again(
        prefix: str, face: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import flowmem.stores.redis._programs as programs

    url = url_with(prefix)
    key = StorageKey("workflow", f"t-{uuid.uuid4().hex}", "conv")
    other = RedisStore.from_url(url)
    other.append(key, canonical_messages(START), max_messages=None, lock_timeout=1.0)
    position = other.history(key).positions[2]  # the result of c1
    late = canonical_messages([{"role": "user", "content": "meanwhile"}])
    real = programs.edit_entries
    calls: list[int] = []

    def edit_then_interfere(entries: Any, where: int, message: Message | None) -> Any:
        calls.append(len(entries))
        if len(calls) == 1:  # another writer, not waiting for the edit's lock
            other.append(key, late, max_messages=None, lock_timeout=0)
        return real(entries, where, message)

    monkeypatch.setattr(programs, "edit_entries", edit_then_interfere)
    corrected = {"role": "tool", "tool_call_id": "c1", "content": "corrected"}
    if face == "sync":
        store = RedisStore.from_url(url)
        assert store.edit(key, position, corrected)
        store.close()
    else:
        async def run() -> bool:
            store = AsyncRedisStore.from_url(url)
            try:
                return await store.edit(key, position, corrected)
            finally:
                await store.aclose()

        assert asyncio.run(run())
    monkeypatch.undo()
    assert calls == [3, 5]  # computed again on the buffer with the append (+ healed c2)
    expected = model_append(START, late).messages
    expected[2] = canonical_messages([corrected])[0]
    assert other.read(key) == (True, expected)
    # the indexes were derived again: c1 is answered once, c2's placeholder is real
    refire = canonical_messages([{"role": "tool", "tool_call_id": "c1", "content": "again"},
                                 {"role": "tool", "tool_call_id": "c2", "content": "late"}])
    outcome = other.append(key, refire, max_messages=None, lock_timeout=1.0)
    assert (outcome.appended, outcome.count) == (0, 5)
    assert model_append(expected, refire).messages == other.read(key)[1]
    other.close()


def test_per_turn_edit_keeps_the_newest_alias(prefix: str) -> None:  # MEM-1/10/15
    """Under call_ids='per_turn' an id's newest answered declaration is named in ``:res``;
    an edit rewrites every index key, that one included: after it, a late result pairs
    with the newest declaration and a re-fired one is a duplicate (MEM-1)."""
    import flowmem

    def turn(n: int) -> dict[str, Any]:
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "f", "arguments": f"[{n}]"}}]}

    context = flowmem.ExecutionContext(workflow_id=f"w{uuid.uuid4().hex}")
    with flowmem.Memory.from_url(url_with(prefix), call_ids="per_turn") as memory:
        batches = [[{"role": "user", "content": "q"}], [turn(0)], [_result("r0")],
                   [turn(1)], [{"role": "user", "content": "next"}]]  # heals turn(1)
        for batch in batches:
            memory.append("workflow", "k", batch, context=context)
        page = memory.history("workflow", "k", context=context)
        assert memory.edit("workflow", "k", page.positions[0],
                           {"role": "user", "content": "edited"}, context=context)
        assert memory.append("workflow", "k", _result("late"), context=context).replaced == 1
        assert memory.append("workflow", "k", _result("late"),
                             context=context).dropped_results == 1
        mine = memory.history("workflow", "k", context=context).messages
    assert [m["content"] for m in mine] == ["edited", None, "r0", None, "late", "next"]


def _result(content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": "1", "content": content}
