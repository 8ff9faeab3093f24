"""``formats.check(..., "anthropic")`` refuses what Anthropic refuses: no messages.

The Messages API needs at least one message (the first a user turn). A
history whose only user content cannot be carried to Anthropic (a
``file_id`` file part, audio) renders to ``{"messages": []}``; the render
counts what it lost, and ``check`` must say the payload would be refused
rather than pass it.
"""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.chat import ChatCompletionMessageParam

from flowmem.formats import check, from_openai_chat, render

FILE_ID: ChatCompletionMessageParam = {"role": "user", "content": [
    {"type": "file", "file": {"file_id": "file_1"}}]}
AUDIO: ChatCompletionMessageParam = {"role": "user", "content": [
    {"type": "input_audio", "input_audio": {"data": "UklG", "format": "wav"}}]}


@pytest.mark.parametrize("user", [FILE_ID, AUDIO])
def test_a_history_with_nothing_anthropic_can_carry_is_refused(user: Any) -> None:
    rendered = render(from_openai_chat([{"role": "system", "content": "Be brief."}, user]),
                      "anthropic")
    assert rendered.output["messages"] == [] and rendered.lost
    problems = check(rendered.output, "anthropic")
    assert [(p.index, p.rule) for p in problems] == [(0, "anthropic.messages")]


@pytest.mark.parametrize("payload", [{"messages": []}, {"system": "x", "messages": []}, []])
def test_empty_messages_are_refused(payload: Any) -> None:
    assert [p.rule for p in check(payload, "anthropic")] == ["anthropic.messages"]


def test_one_user_turn_passes() -> None:
    assert check({"messages": [{"role": "user", "content": "Hi"}]}, "anthropic") == []
