"""Append outcomes that explain themselves, and two checkers that agree.

``appended: 0`` (MEM-14) meant three things with no way to tell them apart:
a late result stored in place (MEM-10), a duplicate dropped (MEM-1), a whole
assistant turn dropped because it reused a call id (MEM-2). The result now
says which, beside the MEM-14 delta (kept exactly), on both faces and over
HTTP; and ``refused`` is in the repr and ``to_dict()`` always.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

import flowmem
from flowmem import AsyncMemory, Memory, formats
from flowmem.scopes import ExecutionContext
from server_support import make_world

CONTEXT = ExecutionContext(user_id="u")
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "late"}
USER = {"role": "user", "content": "next"}
BREAKDOWN = ("count", "appended", "appended_any", "replaced", "dropped_results",
             "dropped_turns", "healed", "refused")
# (messages, count, appended, replaced, dropped_results, dropped_turns, healed)
STEPS: list[tuple[list[dict[str, Any]], tuple[int, ...]]] = [
    ([CALL], (1, 1, 0, 0, 0, 0)),
    ([USER], (3, 1, 0, 0, 0, 1)),      # MEM-3: a placeholder for c1
    ([RESULT], (3, 0, 1, 0, 0, 0)),    # MEM-10: the late result in place
    ([RESULT], (3, 0, 0, 1, 0, 0)),    # MEM-1: a duplicate result
    ([CALL], (3, 0, 0, 0, 1, 0)),      # MEM-2: a turn reusing a declared call id
]


def _figures(report: dict[str, Any]) -> tuple[int, ...]:
    return tuple(report[k] for k in ("count", "appended", "replaced", "dropped_results",
                                     "dropped_turns", "healed"))


def test_each_zero_says_why_on_the_sync_face() -> None:
    memory = Memory.from_url("memory://")
    for messages, expected in STEPS:
        result = memory.append("user", "k", messages, context=CONTEXT)
        report = result.to_dict()
        assert tuple(report) == BREAKDOWN
        assert _figures(report) == expected
        assert report["appended_any"] is (report["appended"] > 0)
        assert "refused=False" in repr(result) and f"replaced={expected[2]}" in repr(result)


def test_each_zero_says_why_on_the_async_face() -> None:
    async def run() -> list[tuple[int, ...]]:
        async with AsyncMemory.from_url("memory://") as memory:
            return [_figures((await memory.append("user", "k", m, context=CONTEXT)).to_dict())
                    for m, _ in STEPS]

    assert asyncio.run(run()) == [expected for _, expected in STEPS]


def test_a_refused_append_shows_refused(caplog: pytest.LogCaptureFixture) -> None:
    memory = Memory.from_url("memory://")
    with caplog.at_level(logging.WARNING, "flowmem"):
        result = memory.append("session", "k", [USER], context=CONTEXT)
    assert result.to_dict()["refused"] is True and "refused=True" in repr(result)
    assert (result.count, result.appended) == (0, 0)
    warning = caplog.records[-1].getMessage()
    assert "None" not in warning and "node -" in warning  # no Python values in the warning


def test_http_answers_the_breakdown_beside_the_delta() -> None:
    world = make_world(seed=False)
    sid = world.new_session("owner")
    for path, extra in (("/v1/memory/append", {"scope": "user", "key": "k"}),
                        (f"/v1/sessions/{sid}/turns", {})):
        for messages, expected in STEPS:
            data = world.call("owner", "POST", path, {**extra, "messages": messages}).json()[
                "data"]
            assert _figures(data) == expected, (path, data)
            assert data["refused"] is False


def test_sendability_agrees_with_the_openai_checker_on_a_tool_call_turn() -> None:
    """OpenAI Chat accepts ``content: null`` on an assistant turn with ``tool_calls``:
    the rendering is sendable by both checkers."""
    history = [{"role": "user", "content": "hi"}, CALL, RESULT]
    rendered = formats.to_openai_chat(history)
    assert rendered[1]["content"] is None
    assert formats.check_openai_chat(rendered) == []
    assert flowmem.sendability_problems(rendered) == []
    # still a problem where no provider takes it
    assert flowmem.sendability_problems([{"role": "user", "content": None}])
    assert flowmem.sendability_problems([{"role": "assistant", "content": None}])
