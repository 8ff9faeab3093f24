"""Sequence rules of each provider: would it accept this transcript?

One checker per dialect, each a single pass returning :class:`Problem`
values (index, rule, what is wrong). The rules are the providers' own
constraints on order and pairing (the shapes of single messages are the SDK
types' business); ``MEM-5`` marks the ones that are also flowmem's Sendable
invariant.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeGuard

__all__ = ["CHECKERS", "Problem", "check_anthropic", "check_openai_chat", "check_responses"]


@dataclass(frozen=True)
class Problem:
    """One breach: the message/item index, the rule, and what is wrong."""

    index: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.index}: {self.rule}: {self.message}"


def _text(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and value != ""


# --------------------------------------------------------------------------- OpenAI Chat

_CHAT_ROLES: Final = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def _chat_calls(index: int, calls: Any) -> Iterator[Problem]:
    if not isinstance(calls, list):
        yield Problem(index, "openai.tool_calls", "tool_calls is not a list")
        return
    for i, call in enumerate(calls):
        where = f"tool_calls[{i}]"
        if not isinstance(call, Mapping) or not _text(call.get("id")):
            yield Problem(index, "openai.tool_calls", f"{where} has no id")
            continue
        kind = call.get("type")
        body = call.get(kind) if kind in ("function", "custom") else None
        if not isinstance(body, Mapping) or not _text(body.get("name")):
            yield Problem(index, "openai.tool_calls",
                          f"{where} needs type 'function' and a function.name")
        elif kind == "function" and not isinstance(body.get("arguments"), str):
            yield Problem(index, "openai.tool_calls", f"{where}.function.arguments "
                          "must be a JSON string")


def check_openai_chat(messages: Any) -> list[Problem]:
    """OpenAI Chat: call entries well formed; every ``tool`` message in the block
    right after the assistant turn declaring its id, each id answered once (MEM-5)."""
    problems: list[Problem] = []
    declared: set[str] = set()
    block: dict[str, bool] = {}
    block_at = -1

    def close() -> None:
        problems.extend(Problem(block_at, "MEM-5", f"call {i!r} has no result after it")
                        for i, answered in block.items() if not answered)
        block.clear()

    for index, message in enumerate(messages if isinstance(messages, list) else []):
        role = message.get("role") if isinstance(message, Mapping) else None
        if role not in _CHAT_ROLES:
            problems.append(Problem(index, "openai.role", f"role {role!r} is not a Chat role"))
            continue
        assert isinstance(message, Mapping)
        if role == "tool":
            found = message.get("tool_call_id")
            if not isinstance(found, str) or found not in block:
                problems.append(Problem(index, "MEM-5", f"tool result {found!r} does not "
                                        "follow the assistant turn declaring it"))
            elif block[found]:
                problems.append(Problem(index, "MEM-5", f"call {found!r} is answered twice"))
            else:
                block[found] = True
            continue
        close()
        if role == "assistant" and message.get("tool_calls") is not None:
            block_at = index
            problems.extend(_chat_calls(index, message["tool_calls"]))
            for call in message["tool_calls"] if isinstance(message["tool_calls"], list) else []:
                found = call.get("id") if isinstance(call, Mapping) else None
                if _text(found) and found in declared:
                    problems.append(Problem(index, "MEM-5", f"call {found!r} declared twice"))
                elif _text(found):
                    declared.add(found)
                    block[found] = False
    close()
    return problems


# --------------------------------------------------------------------------- Responses

_CALL_ITEMS: Final = {"function_call": "function_call_output",
                      "custom_tool_call": "custom_tool_call_output"}
_OUTPUT_ITEMS: Final = {v: k for k, v in _CALL_ITEMS.items()}


def check_responses(items: Any) -> list[Problem]:
    """OpenAI Responses: every call item answered by exactly one output of the
    matching type with its ``call_id``, after it; no ``call_id`` used twice."""
    problems: list[Problem] = []
    open_calls: dict[str, tuple[int, str]] = {}
    seen: set[str] = set()
    for index, item in enumerate(items if isinstance(items, list) else []):
        if not isinstance(item, Mapping):
            problems.append(Problem(index, "responses.item", "not an item mapping"))
            continue
        kind, found = item.get("type"), item.get("call_id")
        if kind in _CALL_ITEMS:
            if not _text(found) or found in seen:
                problems.append(Problem(index, "MEM-5", f"call_id {found!r} unusable or reused"))
                continue
            seen.add(found)
            open_calls[found] = (index, kind)
        elif kind in _OUTPUT_ITEMS:
            call = open_calls.pop(found, None) if isinstance(found, str) else None
            if call is None or _OUTPUT_ITEMS[kind] != call[1]:
                problems.append(Problem(index, "MEM-5", f"{kind} {found!r} answers no "
                                        "earlier unanswered call"))
    problems.extend(Problem(at, "MEM-5", f"{kind} {found!r} has no output")
                    for found, (at, kind) in open_calls.items())
    return sorted(problems, key=lambda p: p.index)


# --------------------------------------------------------------------------- Anthropic

def _blocks_of(message: Mapping[str, Any]) -> list[Any]:
    content = message.get("content")
    return content if isinstance(content, list) else []


def _anthropic_turn(index: int, message: Any, previous: set[str],
                    problems: list[Problem]) -> tuple[str | None, set[str]]:
    """Check one turn; return its role and the tool_use ids it declares."""
    if not isinstance(message, Mapping) or message.get("role") not in ("user", "assistant"):
        problems.append(Problem(index, "anthropic.role", "role must be 'user' or 'assistant'"))
        return None, set()
    role, content, blocks = message["role"], message.get("content"), _blocks_of(message)
    if content in ("", None, []) or any(isinstance(b, Mapping) and b.get("type") == "text"
                                       and b.get("text") == "" for b in blocks):
        problems.append(Problem(index, "anthropic.content", "empty content or text block"))
    kinds = [b.get("type") if isinstance(b, Mapping) else None for b in blocks]
    if role == "assistant":
        if "tool_result" in kinds:
            problems.append(Problem(index, "anthropic.tool_result", "tool_result in an "
                                    "assistant turn"))
        return role, {b.get("id") for b in blocks if b.get("type") == "tool_use"}
    answered = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
    if kinds[:len(answered)] != ["tool_result"] * len(answered):
        problems.append(Problem(index, "anthropic.tool_result", "tool_result blocks must "
                                "come first in the user turn"))
    if len(set(answered)) != len(answered) or not set(answered) <= previous:
        problems.append(Problem(index, "MEM-5", "a tool_result answers no tool_use of the "
                                "turn before, or answers one twice"))
    if previous - set(answered):
        problems.append(Problem(index, "MEM-5", f"tool_use {sorted(previous - set(answered))} "
                                "not answered in the next user turn"))
    return role, set()


def check_anthropic(payload: Any) -> list[Problem]:
    """Anthropic: at least one turn, the first ``user``, strict alternation, no empty
    content, every ``tool_use`` answered in the very next user turn (results
    first), no id twice."""
    given = payload.get("messages") if isinstance(payload, Mapping) else payload
    messages: list[Any] = given if isinstance(given, list) else []
    problems: list[Problem] = []
    if not messages:
        problems.append(Problem(0, "anthropic.messages", "no messages: Anthropic needs at "
                                "least one user turn"))
    previous_role: str | None = None
    previous: set[str] = set()
    declared: set[str] = set()
    for index, message in enumerate(messages):
        role, uses = _anthropic_turn(index, message, previous, problems)
        if index == 0 and role != "user":
            problems.append(Problem(index, "anthropic.first", "the first turn must be user"))
        if role is not None and role == previous_role:
            problems.append(Problem(index, "anthropic.alternation",
                                    f"two {role} turns in a row"))
        if uses & declared:
            problems.append(Problem(index, "MEM-5", f"tool_use {sorted(uses & declared)} "
                                    "declared twice"))
        declared |= uses
        previous_role, previous = role, uses
    if previous:
        problems.append(Problem(len(messages), "MEM-5", f"tool_use {sorted(previous)} has "
                                "no tool_result"))
    return problems


CHECKERS: Final[dict[str, Callable[[Any], list[Problem]]]] = {
    "openai": check_openai_chat, "responses": check_responses, "anthropic": check_anthropic}
"""The sequence checker of each provider format."""
