"""``format=`` on Memory/AsyncMemory.append (#11): the rules apply by call id
whatever the dialect (MEM-1, MEM-3, MEM-10, MEM-11)."""

from __future__ import annotations

import asyncio

import pytest

from flowmem import AsyncMemory, ExecutionContext, InvalidInput, Memory, formats

CTX = ExecutionContext(user_id="u")


def test_responses_items_heal_and_late_output_replaces() -> None:
    with Memory.from_url("memory://") as memory:
        memory.append("user", "k", [{"role": "user", "content": "hi"},
                                    {"type": "function_call", "call_id": "c1", "name": "f",
                                     "arguments": "{}"}], context=CTX, format="responses")
        healed = memory.append("user", "k", {"role": "user", "content": "again"}, context=CTX)
        assert healed.messages[2]["metadata"] == {"tool_call_id": "c1", "healed": True}
        late = memory.append("user", "k", [{"type": "function_call_output", "call_id": "c1",
                                            "output": "late"}], context=CTX, format="responses")
        assert (late.count, late.appended) == (4, 0)  # MEM-10: replaced in place
        assert late.messages[2]["content"] == "late"
        assert formats.check(formats.to_responses(late.messages), "responses") == []


def test_a_refired_anthropic_tool_result_is_stored_once_on_the_async_face() -> None:
    use = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f",
                                             "input": {}}]}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                           "content": "ok"}]}

    async def run() -> list[int]:
        async with AsyncMemory.from_url("memory://") as memory:
            first = await memory.append("user", "k", [{"role": "user", "content": "q"}, use,
                                                      result], context=CTX, format="anthropic")
            again = await memory.append("user", "k", [result], context=CTX,
                                        format="anthropic")
            return [first.appended, again.appended, again.count]

    assert asyncio.run(run()) == [3, 0, 3]  # MEM-1 across dialects


def test_an_unknown_format_is_invalid_input() -> None:
    with Memory.from_url("memory://") as memory, pytest.raises(InvalidInput):
        memory.append("user", "k", {"role": "user", "content": "x"}, context=CTX,
                      format="gemini")
