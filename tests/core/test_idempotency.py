"""Exactly-once retries through the coordinator (#10): ``idempotency_key=`` on
Memory.append/write/delete, on every backend (the store-level cases are in the
public conformance suite)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from backends import Backend
from flowmem import (
    AsyncMemory,
    DeleteResult,
    ExecutionContext,
    IdempotencyConflict,
    InvalidInput,
    Memory,
)

CTX = ExecutionContext(user_id="u-1", workflow_id="wf")


@pytest.fixture
def memory(backend: Backend) -> Memory:
    return Memory.from_url(backend.url)


def test_a_retried_turn_is_stored_once(memory: Memory) -> None:
    key, ikey = f"k{uuid.uuid4().hex}", f"i{uuid.uuid4().hex}"
    turn = {"role": "user", "content": "hello"}
    first = memory.append("user", key, turn, context=CTX, idempotency_key=ikey)
    retry = memory.append("user", key, turn, context=CTX, idempotency_key=ikey)
    assert (first.appended, first.replayed) == (1, False)
    assert (retry.count, retry.appended, retry.replayed) == (1, 1, True)
    assert memory.history("user", key, context=CTX).messages == first.messages
    with pytest.raises(IdempotencyConflict):
        memory.append("user", key, {"role": "user", "content": "other"}, context=CTX,
                      idempotency_key=ikey)
    # A key is scoped to the conversation it names: on another one it is another operation.
    elsewhere = memory.append("user", key + "x", turn, context=CTX, idempotency_key=ikey)
    assert (elsewhere.appended, elsewhere.replayed) == (1, False)
    with pytest.raises(IdempotencyConflict):  # a window is part of the input
        memory.append("user", key, turn, context=CTX, idempotency_key=ikey, max_messages=5)
    assert len(memory.history("user", key, context=CTX).messages) == 1
    memory.close()


def test_write_and_delete_retries(memory: Memory) -> None:
    key, ikey = f"v{uuid.uuid4().hex}", uuid.uuid4().hex
    assert memory.write("workflow", key, {"a": 1}, context=CTX, idempotency_key=ikey).ok
    memory.write("workflow", key, {"a": 2}, context=CTX)
    memory.write("workflow", key, {"a": 1}, context=CTX, idempotency_key=ikey)
    assert memory.read("workflow", key, context=CTX).value == {"a": 2}
    assert memory.delete("workflow", key, context=CTX, idempotency_key=ikey + "d").found
    assert memory.delete("workflow", key, context=CTX, idempotency_key=ikey + "d").found
    memory.close()


def _found_replayed(result: DeleteResult) -> tuple[bool, bool]:
    return result.found, result.replayed


@pytest.mark.parametrize("face", ["blocking", "async"])
def test_a_retried_delete_says_it_replayed(backend: Backend, face: str) -> None:
    """A delete repeated with its key replays the first ``found`` (``replayed=True``) and
    changes nothing, even after another write; the key elsewhere is another delete."""
    key, ikey = f"d{uuid.uuid4().hex}", uuid.uuid4().hex

    async def steps(memory: AsyncMemory) -> list[Any]:
        await memory.write("workflow", key, {"a": 1}, context=CTX)
        first = await memory.delete("workflow", key, context=CTX, idempotency_key=ikey)
        await memory.write("workflow", key, {"a": 2}, context=CTX)  # written again since
        retry = await memory.delete("workflow", key, context=CTX, idempotency_key=ikey)
        elsewhere = await memory.delete("workflow", key + "x", context=CTX,
                                        idempotency_key=ikey)
        kept = (await memory.read("workflow", key, context=CTX)).value
        with pytest.raises(IdempotencyConflict):  # the same key for another change
            await memory.write("workflow", key, {"a": 3}, context=CTX, idempotency_key=ikey)
        return [_found_replayed(first), _found_replayed(retry), _found_replayed(elsewhere),
                kept]

    async def run() -> list[Any]:
        if face == "async":
            async with AsyncMemory.from_url(backend.url) as memory:
                return await steps(memory)
        with Memory.from_url(backend.url) as blocking:
            return await steps(_Awaited(blocking))  # type: ignore[arg-type]

    assert asyncio.run(run()) == [(True, False), (True, True), (False, False), {"a": 2}]


class _Awaited:
    """A blocking Memory called through ``await`` (one list of steps for both faces)."""

    def __init__(self, memory: Memory) -> None:
        self._memory = memory

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._memory, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return method(*args, **kwargs)
        return call


@pytest.mark.parametrize("bad", ["", "x" * 256, 7, "a\x00b"])
def test_a_bad_idempotency_key_is_invalid_input_and_changes_nothing(memory: Memory,
                                                                      bad: object) -> None:
    key = f"b{uuid.uuid4().hex}"
    with pytest.raises(InvalidInput):
        memory.append("user", key, {"role": "user", "content": "x"}, context=CTX,
                      idempotency_key=bad)  # type: ignore[arg-type]
    assert memory.history("user", key, context=CTX).messages == []
    memory.close()


def test_a_refused_scope_records_no_key(memory: Memory) -> None:
    """MEM-7: a refusal reaches no backend, so the key stays unused."""
    ikey = uuid.uuid4().hex
    anon = ExecutionContext(user_id=0)
    assert memory.append("user", "k", {"role": "user", "content": "x"}, context=anon,
                         idempotency_key=ikey).refused
    result = memory.append("user", f"k{ikey}", {"role": "user", "content": "x"}, context=CTX,
                           idempotency_key=ikey)
    assert (result.appended, result.replayed) == (1, False)
    memory.close()


def test_the_cli_takes_an_idempotency_key(tmp_path: Any) -> None:
    """``flowmem append|write|delete --idempotency-key``: a retried command changes nothing."""
    import json

    from click.testing import CliRunner

    from flowmem.cli._main import main

    where = ["--store", f"sqlite:///{tmp_path / 'c.db'}", "--scope", "user", "--user", "a",
             "--key", "chat"]
    run = CliRunner().invoke
    x, y = '{"role": "user", "content": "x"}', '{"role": "user", "content": "y"}'
    first = run(main, ["append", *where, "--idempotency-key", "t1", x])
    again = run(main, ["append", *where, "--idempotency-key", "t1", x])
    assert [json.loads(r.output)["replayed"] for r in (first, again)] == [False, True]
    reused = run(main, ["append", *where, "--idempotency-key", "t1", y])
    assert reused.exit_code == 5 and "different request" in reused.output
    assert run(main, ["write", *where[:-1], "v", "--idempotency-key", "w1", "1"]).exit_code == 0
    deletes = [run(main, ["delete", *where[:-1], "v", "--idempotency-key", "d1"])
               for _ in range(2)]
    assert [d.exit_code for d in deletes] == [0, 0]
    assert [(json.loads(d.output)["found"], json.loads(d.output)["replayed"])
            for d in deletes] == [(True, False), (True, True)]
