"""Fakes of the frameworks' model interfaces (no network) and sendability checks.

The fakes implement each framework's real model interface (LangChain's
``BaseChatModel``, the Agents SDK's ``Model``) and return canned replies,
recording every input the framework sends, so a test can check that what
reached the model was sendable.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("langchain_core")

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, convert_to_openai_messages
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field

from flowmem.formats import check


class ScriptedChatModel(BaseChatModel):
    """A LangChain chat model replying from a script; ``seen`` holds every input."""

    replies: list[AIMessage]
    seen: list[list[BaseMessage]] = Field(default_factory=list)

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        self.seen.append(list(messages))
        return ChatResult(generations=[ChatGeneration(message=self.replies.pop(0))])

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChatModel:
        return self


def tool_call(call_id: str, city: str) -> dict[str, Any]:
    """A LangChain tool call of the ``weather`` tool."""
    return {"name": "weather", "args": {"city": city}, "id": call_id, "type": "tool_call"}


def openai_problems(messages: list[BaseMessage]) -> list[Any]:
    """What OpenAI Chat would refuse in ``messages`` (LangChain's own OpenAI conversion)."""
    return check(convert_to_openai_messages(messages), "openai")
