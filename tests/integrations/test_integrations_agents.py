"""OpenAI Agents SDK: FlowmemSession (issue #13).

Mirrored from the SDK's own ``SQLiteSession`` tests (``tests/test_session.py``):
memory across runs (the second turn's input holds the first), different
sessions apart, the session used directly (add, get, clear), ``pop_item``
(empty -> ``None``, newest first, only its own session), ``get_items`` with
a limit (latest in order, more than stored -> all, 0 -> none), and
``session_settings.limit`` as the default (SDK session settings tests).
Not mirrored: ``run_sync``/``run_streamed`` variants (the fake model here
does not stream) and the list-input-with-session refusal (the SDK's, not the
session's). Then several
``Runner.run`` turns over a fake ``Model`` with a function tool.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, ModelResponse, Runner, Usage, function_tool
from agents.memory import Session, SessionSettings
from agents.models.interface import Model
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
)
from openai.types.responses.response_reasoning_item import Summary

import flowmem
from flowmem.formats import check
from flowmem.integrations.agents import FlowmemSession


class ScriptedModel(Model):
    """The SDK's Model interface, replying from a script; ``seen`` holds every input."""

    def __init__(self, script: list[list[Any]]) -> None:
        self.script = script
        self.seen: list[Any] = []

    async def get_response(self, system_instructions: Any, input: Any, model_settings: Any,
                           tools: Any, output_schema: Any, handoffs: Any, tracing: Any,
                           **kwargs: Any) -> ModelResponse:
        self.seen.append([dict(item) for item in input] if isinstance(input, list) else input)
        return ModelResponse(output=self.script.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


@function_tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def call(call_id: str, city: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(type="function_call", call_id=call_id, name="weather",
                                    arguments=json.dumps({"city": city}), id=f"fc_{call_id}",
                                    status="completed")


def say(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(id=f"msg_{text[:4]}", type="message", role="assistant",
                                 status="completed", content=[ResponseOutputText(
                                     type="output_text", text=text, annotations=[])])


def think(n: int) -> ResponseReasoningItem:
    return ResponseReasoningItem(id=f"rs_{n}", type="reasoning",
                                 summary=[Summary(type="summary_text", text="thinking")])


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture
def memory(tmp_path: Any) -> Any:
    return flowmem.AsyncMemory.from_url(f"sqlite:///{tmp_path / 'agents.db'}")


def test_is_a_session(memory: Any) -> None:
    assert isinstance(FlowmemSession("s", memory), Session)
    with pytest.raises(flowmem.MessageTypeError):
        FlowmemSession("s", flowmem.Memory.from_url("memory://"))  # type: ignore[arg-type]


# -- mirrored from the SDK's SQLiteSession tests -------------------------------

def test_direct_operations(memory: Any) -> None:
    async def go() -> None:
        session = FlowmemSession("direct", memory)
        assert await session.get_items() == [] and await session.pop_item() is None
        items = [user("Hello"), {"role": "assistant", "content": "Hi"}, user("How?")]
        await session.add_items(items)
        assert await session.get_items() == items
        assert await session.get_items(2) == items[1:]
        assert await session.get_items(0) == []
        assert await session.get_items(10) == items
        assert await session.pop_item() == items[-1]
        assert await session.get_items() == items[:2]
        await session.clear_session()
        assert await session.get_items() == []
        await memory.aclose()

    run(go())


def test_sessions_kept_apart_and_settings_limit(memory: Any) -> None:
    async def go() -> None:
        one = FlowmemSession("one", memory, session_settings={"limit": 1})
        two = FlowmemSession("two", memory, session_settings=SessionSettings(limit=None))
        await one.add_items([user("a"), user("b")])
        await two.add_items([user("c")])
        assert await one.get_items() == [user("b")]
        assert await one.get_items(limit=2) == [user("a"), user("b")]
        assert await two.get_items() == [user("c")]
        await memory.aclose()

    run(go())


def test_runs_remember_and_sessions_stay_apart(memory: Any) -> None:
    model = ScriptedModel([[say("I like cats")], [say("I like dogs")], [say("You said cats")]])
    agent = Agent(name="plain", model=model)

    async def go() -> None:
        one, two = FlowmemSession("one", memory), FlowmemSession("two", memory)
        await Runner.run(agent, "I like cats", session=one)
        await Runner.run(agent, "I like dogs", session=two)
        result = await Runner.run(agent, "What did I say?", session=one)
        assert result.final_output == "You said cats"
        assert [i.get("content") for i in model.seen[-1] if i.get("role") == "user"] == \
            ["I like cats", "What did I say?"]  # the history, and not the other session's
        await two.add_items([user("two again")])
        assert await two.pop_item() == user("two again")
        assert len(await one.get_items()) == 4 and len(await two.get_items()) == 2
        await memory.aclose()

    run(go())


def test_pop_item_takes_exactly_the_last_item_of_a_turn(memory: Any) -> None:
    async def go() -> None:
        session = FlowmemSession("pop", memory)
        turn = [think(1).model_dump(exclude_unset=True), say("Checking.").model_dump(
            exclude_unset=True), call("c1", "Paris").model_dump(exclude_unset=True),
            call("c2", "Rome").model_dump(exclude_unset=True)]
        await session.add_items([user("Weather?"), *turn])
        assert await session.get_items() == [user("Weather?"), *turn]
        for expected in reversed(turn):  # one stored turn holds four items
            assert await session.get_items(1) == [expected]
            assert await session.pop_item() == expected
        assert await session.get_items() == [user("Weather?")]
        await memory.aclose()

    run(go())


# -- end to end: Runner.run turns on one session --------------------------------

def test_runner_turns_refire_and_heal(memory: Any) -> None:
    model = ScriptedModel([
        [think(1), call("c1", "Paris"), call("c2", "Rome")],
        [say("Sunny in both.")],
        [call("c3", "Oslo")],
        [say("Fine, no Oslo.")],
    ])
    agent = Agent(name="weather", model=model, tools=[weather])

    async def go() -> None:
        session = FlowmemSession("chat-1", memory)
        first = await Runner.run(agent, "Weather in Paris and Rome?", session=session)
        assert first.final_output == "Sunny in both."
        stored = await session.get_items()
        output = next(i for i in stored if i.get("type") == "function_call_output")
        await session.add_items([output])  # a retried write re-fires a result: MEM-1
        assert await session.get_items() == stored
        # an interrupted turn: the call was saved, its output never came
        await session.add_items([user("And Oslo?"), call("c3", "Oslo").model_dump(
            exclude_unset=True)])
        last = await Runner.run(agent, "Never mind.", session=session)
        assert last.final_output == "Fine, no Oslo."
        history = await session.get_items()
        await memory.aclose()
        return history

    history = run(go())
    for sent in model.seen:
        assert check(sent, "responses") == []
    outputs = [i["call_id"] for i in history if i.get("type") == "function_call_output"]
    assert outputs == ["c1", "c2", "c3"]  # c1 once; c3 healed (MEM-3)
    assert any(i.get("type") == "reasoning" for i in history)  # reasoning kept
    assert check(history, "responses") == []


def test_items_round_trip_exactly(memory: Any) -> None:
    items = [user("hi"), {"role": "developer", "content": "be brief"},
             {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "xyz"},
             {"type": "custom_tool_call", "call_id": "k1", "name": "grammar", "input": "abc"},
             {"type": "custom_tool_call_output", "call_id": "k1", "output": "ok"},
             call("c1", "Paris").model_dump(exclude_unset=True),
             {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
             say("Done.").model_dump(exclude_unset=True)]

    async def go() -> None:
        session = FlowmemSession("rt", memory)
        await session.add_items(items)
        assert await session.get_items() == items
        await memory.aclose()

    run(go())
