"""A message in another dialect is refused, naming the converter to use.

A converter that kept another dialect's pairing fields as opaque extras
would store calls nobody declared: never deduplicated (MEM-1/2), never
healed (MEM-3), and dropped by every renderer without a word. So each
``from_*`` refuses what belongs to another dialect with
:class:`flowmem.InvalidMessage` (``where[index].field``), whose message names
the converter that keeps the pairing (ids read once, MEM-11). The shapes are
the SDKs' own (``openai`` Chat ``ChatCompletionAssistantMessageParam`` /
``ChatCompletionToolMessageParam``, Responses function call items,
Anthropic ``tool_use`` blocks).
"""

from __future__ import annotations

from typing import Any

import pytest
from anthropic.types import MessageParam
from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionToolMessageParam,
)
from openai.types.responses import ResponseFunctionToolCallParam

import flowmem
from flowmem.formats import from_anthropic, from_responses, to_canonical

CHAT_CALL: ChatCompletionAssistantMessageParam = {
    "role": "assistant", "content": None,
    "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]}
CHAT_RESULT: ChatCompletionToolMessageParam = {"role": "tool", "tool_call_id": "c1",
                                               "content": "sunny"}
CHAT_LEGACY: Any = {"role": "assistant", "content": None,
                    "function_call": {"name": "weather", "arguments": "{}"}}
RESPONSES_CALL: ResponseFunctionToolCallParam = {
    "type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"}
ANTHROPIC_USE: MessageParam = {"role": "assistant", "content": [
    {"type": "tool_use", "id": "c1", "name": "weather", "input": {"city": "Paris"}}]}
ANTHROPIC_RESULT: MessageParam = {"role": "user", "content": [
    {"type": "tool_result", "tool_use_id": "c1", "content": "sunny"}]}
USER: Any = {"role": "user", "content": "Weather?"}


def refused(convert: Any, messages: Any) -> flowmem.InvalidMessage:
    with pytest.raises(flowmem.InvalidMessage) as caught:
        convert(messages)
    return caught.value


@pytest.mark.parametrize(("message", "field"), [
    (CHAT_CALL, "tool_calls"), (CHAT_RESULT, "role"), (CHAT_LEGACY, "function_call")])
def test_chat_messages_are_refused_by_from_responses(message: Any, field: str) -> None:
    error = refused(from_responses, [USER, message])
    assert str(error).startswith(f"responses[1].{field}: ")
    assert "from_openai_chat" in str(error)


@pytest.mark.parametrize(("message", "field"), [
    (CHAT_CALL, "tool_calls"), (CHAT_RESULT, "role"), (CHAT_LEGACY, "function_call")])
def test_chat_messages_are_refused_by_from_anthropic(message: Any, field: str) -> None:
    error = refused(from_anthropic, [USER, message])
    assert str(error).startswith(f"anthropic[1].{field}: ")
    assert "from_openai_chat" in str(error)


def test_responses_items_are_refused_by_from_anthropic() -> None:
    error = refused(from_anthropic, [USER, RESPONSES_CALL])
    assert str(error).startswith("anthropic[1].type: ") and "from_responses" in str(error)


@pytest.mark.parametrize(("message", "block"), [(ANTHROPIC_USE, 0), (ANTHROPIC_RESULT, 0)])
def test_anthropic_blocks_are_refused_by_from_responses(message: Any, block: int) -> None:
    error = refused(from_responses, [USER, message])
    assert str(error).startswith(f"responses[1].content[{block}]: ")
    assert "from_anthropic" in str(error)


@pytest.mark.parametrize("format", ["responses", "anthropic"])
def test_append_in_the_wrong_format_stores_nothing(format: str) -> None:
    """MEM-2/3 need the call declared: an append of a Chat call turn under
    ``format="responses"|"anthropic"`` is refused whole, nothing stored."""
    memory = flowmem.Memory.from_url("memory://")
    context = flowmem.ExecutionContext(session_id="s1")
    with pytest.raises(flowmem.InvalidMessage, match="from_openai_chat"):
        to_canonical([USER, CHAT_CALL], format)
    with pytest.raises(flowmem.InvalidMessage, match="from_openai_chat"):
        memory.append("session", "chat", [USER, CHAT_CALL], context=context, format=format)
    assert memory.history("session", "chat", context=context).messages == []


def test_each_dialect_still_takes_its_own() -> None:
    """The refusals above are precise: each converter keeps taking its own dialect."""
    assert from_responses([USER, RESPONSES_CALL])[1]["metadata"]["tool_calls"][0]["id"] == "c1"
    converted = from_anthropic([USER, ANTHROPIC_USE, ANTHROPIC_RESULT])
    assert [m["role"] for m in converted] == ["user", "assistant", "tool"]
