"""Generated agent conversations in three dialects, and the checks a provider makes.

A conversation is drawn as dialect-neutral events (system, user, assistant
turn declaring calls, tool result) with the faults agents produce: re-fired
results, interrupted calls, late results. Each event is written in a dialect
(one fixed dialect, or a different one per event: mixed) and appended through
:func:`flowmem.formats.to_canonical` and a real :class:`flowmem.ConversationBuffer`
(optionally windowed), so the stored history is what flowmem really keeps.

Every rendering is validated with the official SDK param types (pydantic
``TypeAdapter``, strict, unknown keys forbidden) and the provider's sequence
rules; ``fields lost`` compares what the target carries (texts, images, calls
with parsed arguments, results) before and after the round trip.

``FLOWMEM_FORMATS_FIGURES=path pytest tests/test_formats_properties.py`` writes
the figures (``FLOWMEM_FORMATS_EXAMPLES`` sets how many conversations).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from anthropic.types import MessageParam, TextBlockParam
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionMessageParam
from openai.types.responses import ResponseInputItemParam
from pydantic import ConfigDict, TypeAdapter, ValidationError

from flowmem import ConversationBuffer, formats
from flowmem.normalize import repair_pairing

Event = dict[str, Any]
DIALECTS = ("openai", "responses", "anthropic")
IMAGE = "data:image/png;base64,iVBORw0KGgo="

_STRICT = ConfigDict(strict=True, extra="forbid")
CHAT_TYPE: TypeAdapter[Any] = TypeAdapter(ChatCompletionMessageParam, config=_STRICT)
RESPONSES_TYPE: TypeAdapter[Any] = TypeAdapter(ResponseInputItemParam, config=_STRICT)
ANTHROPIC_TYPE: TypeAdapter[Any] = TypeAdapter(MessageParam, config=_STRICT)
SYSTEM_TYPE: TypeAdapter[Any] = TypeAdapter(str | list[TextBlockParam], config=_STRICT)

words = st.sampled_from(["hi", "find cats", "Found 3 cats", "ok", "résumé ✓", "a\nb"])


# --------------------------------------------------------------------------- events

FATES = st.sampled_from(["ok"] * 6 + ["refire", "lost", "late"])
"""A call's fate: answered, answered twice (re-fired), never answered (lost: healed at
the next user turn) or answered after the next user turn (late)."""


def call_results(calls: list[tuple[str, str, dict[str, Any]]], fate: Callable[[], str],
                 text: Callable[[], str], events: list[Event], late: list[Event]) -> bool:
    """The results of one round of ``calls``, each by its ``fate()`` (see :data:`FATES`):
    appended to ``events``, or kept in ``late`` for after the next user turn. Whether any
    was lost or late (then the turn ends interrupted)."""
    interrupted = False
    for call_id, _name, _args in calls:
        kind = fate()
        result: Event = {"kind": "result", "id": call_id, "text": text()}
        if kind == "late":
            late.append(result)
            interrupted = True
        elif kind == "lost":
            interrupted = True
        else:
            events.append(result)
            if kind == "refire":
                events.append({**result, "text": "again"})
    return interrupted

@st.composite
def conversations(draw: st.DrawFn, faults: bool = True) -> list[Event]:
    """Dialect-neutral events of one conversation, faults included unless ``faults=False``."""
    events: list[Event] = []
    if draw(st.booleans()):
        events.append({"kind": "system", "text": draw(words), "developer": draw(st.booleans())})
    late: list[Event] = []
    counter = 0
    for _turn in range(draw(st.integers(1, 5))):
        events.append({"kind": "user", "text": draw(words), "image": draw(st.booleans())})
        events.extend(late)
        late = []
        interrupted = False
        for _round in range(draw(st.integers(0, 2))):
            calls = []
            for _ in range(draw(st.integers(1, 3))):
                counter += 1
                calls.append((f"call_{counter}", draw(st.sampled_from(["search", "get"])),
                              {"q": draw(words), "n": draw(st.integers(0, 9))}))
            events.append({"kind": "assistant", "text": draw(st.one_of(st.none(), words)),
                           "calls": calls, "thinking": draw(st.booleans()),
                           "reasoning": draw(st.booleans())})
            if call_results(calls, lambda: draw(FATES) if faults else "ok",
                            lambda: draw(words), events, late):
                interrupted = True
        if not interrupted:
            events.append({"kind": "assistant", "text": draw(words), "calls": [],
                           "thinking": False, "reasoning": False})
    return events


# --------------------------------------------------------------------------- writers

def chat(event: Event) -> list[dict[str, Any]]:
    kind = event["kind"]
    if kind == "system":
        return [{"role": "developer" if event["developer"] else "system",
                 "content": event["text"]}]
    if kind == "user":
        content: Any = event["text"] if not event["image"] else [
            {"type": "text", "text": event["text"]},
            {"type": "image_url", "image_url": {"url": IMAGE}}]
        return [{"role": "user", "content": content}]
    if kind == "result":
        return [{"role": "tool", "tool_call_id": event["id"], "content": event["text"]}]
    message: dict[str, Any] = {"role": "assistant", "content": event["text"]}
    if event["calls"]:
        message["tool_calls"] = [{"id": i, "type": "function", "function": {
            "name": n, "arguments": json.dumps(a)}} for i, n, a in event["calls"]]
    return [message]


def responses(event: Event) -> list[dict[str, Any]]:
    kind = event["kind"]
    if kind in ("system", "user") and not event.get("image"):
        role = "developer" if event.get("developer") else kind
        return [{"role": role, "content": event["text"]}]
    if kind == "user":
        return [{"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": event["text"]},
            {"type": "input_image", "image_url": IMAGE, "detail": "auto"}]}]
    if kind == "result":
        return [{"type": "function_call_output", "call_id": event["id"],
                 "output": event["text"]}]
    items: list[dict[str, Any]] = []
    if event["reasoning"]:
        items.append({"type": "reasoning", "id": f"rs_{event['calls'][0][0]}",
                      "summary": [{"type": "summary_text", "text": "plan"}],
                      "encrypted_content": "gAAAA"})
    if event["text"] is not None:
        items.append({"role": "assistant", "content": event["text"]})
    items.extend({"type": "function_call", "call_id": i, "name": n, "arguments": json.dumps(a),
                  "id": f"fc_{i}", "status": "completed"} for i, n, a in event["calls"])
    return items


def anthropic(event: Event) -> dict[str, Any]:
    """One event as an Anthropic payload ``{"system"?, "messages"}``."""
    kind = event["kind"]
    if kind == "system":
        return {"system": event["text"], "messages": []}
    if kind == "user":
        content: Any = event["text"] if not event["image"] else [
            {"type": "text", "text": event["text"]},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": IMAGE.split(",")[1]}}]
        return {"messages": [{"role": "user", "content": content}]}
    if kind == "result":
        return {"messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": event["id"], "content": event["text"]}]}]}
    blocks: list[dict[str, Any]] = []
    if event["thinking"]:
        blocks.append({"type": "thinking", "thinking": "plan", "signature": "sig=="})
    if event["text"] is not None:
        blocks.append({"type": "text", "text": event["text"]})
    blocks.extend({"type": "tool_use", "id": i, "name": n, "input": a}
                  for i, n, a in event["calls"])
    if not event["calls"] and not event["thinking"]:
        return {"messages": [{"role": "assistant", "content": event["text"]}]}
    return {"messages": [{"role": "assistant", "content": blocks}]}


def transcript(events: list[Event], dialect: str) -> Any:
    """A whole conversation written natively in ``dialect`` (Anthropic turns merged)."""
    if dialect == "openai":
        return [m for e in events for m in chat(e)]
    if dialect == "responses":
        return [m for e in events for m in responses(e)]
    payload: dict[str, Any] = {"messages": []}
    for event in events:
        part = anthropic(event)
        if "system" in part:
            payload["system"] = part["system"]
        for message in part["messages"]:
            turns = payload["messages"]
            if turns and turns[-1]["role"] == message["role"]:
                turns[-1]["content"] = _blocks(turns[-1]["content"]) + \
                    _blocks(message["content"])
            else:
                turns.append(dict(message))
    return payload


def _blocks(content: Any) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


WRITERS = {"openai": chat, "responses": responses, "anthropic": anthropic}


def store(events: list[Event], dialects: list[str], window: int | None) -> list[dict[str, Any]]:
    """Append event by event (event ``i`` written in ``dialects[i % len]``); the stored history."""
    buffer = ConversationBuffer(max_messages=window)
    for index, event in enumerate(events):
        dialect = dialects[index % len(dialects)]
        buffer.append(formats.to_canonical(WRITERS[dialect](event), dialect))
    return buffer.messages


# --------------------------------------------------------------------------- checks

def type_errors(output: Any, dialect: str) -> tuple[int, int]:
    """(messages validated, messages refused by the SDK types) of one rendering."""
    if dialect == "anthropic":
        items, adapter = output["messages"], ANTHROPIC_TYPE
        refused = 0 if "system" not in output else _refused(SYSTEM_TYPE, output["system"])
    else:
        items, adapter, refused = output, CHAT_TYPE if dialect == "openai" else RESPONSES_TYPE, 0
    return len(items), refused + sum(_refused(adapter, item) for item in items)


def _refused(adapter: TypeAdapter[Any], value: Any) -> int:
    try:
        _consume(adapter.validate_python(value))
    except ValidationError:
        return 1
    return 0


def _consume(value: Any) -> None:
    """Walk a validated value: pydantic validates ``Iterable`` fields (tool_calls,
    content parts, blocks) lazily, element by element, only when iterated."""
    if isinstance(value, dict):
        for item in value.values():
            _consume(item)
    elif isinstance(value, list | tuple | Iterator):
        for item in value:
            _consume(item)


def atoms(history: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What every target carries, in order: texts, images, calls (parsed arguments), results."""
    out: list[tuple[Any, ...]] = []
    for message in history:
        role, meta = message["role"], message.get("metadata") or {}
        if role == "tool":
            out.append(("result", meta.get("tool_call_id"), message.get("content")))
            continue
        content = message.get("content")
        for part in content if isinstance(content, list) else [content]:
            out.extend(_part_atoms(role, part))
        for call in meta.get("tool_calls") or ():
            out.append(("call", call["id"], call["function"]["name"],
                        json.dumps(json.loads(call["function"]["arguments"]), sort_keys=True)))
    return out


def _part_atoms(role: str, part: Any) -> list[tuple[Any, ...]]:
    if isinstance(part, str):
        return [(role, part)] if part else []
    if not isinstance(part, dict):
        return []
    if part.get("type") in ("text", "input_text", "output_text"):
        return [(role, part["text"])]
    if part.get("type") == "image_url":
        return [("image", part["image_url"]["url"])]
    if part.get("type") == "input_image":
        return [("image", part["image_url"])]
    if part.get("type") == "image":
        source = part["source"]
        return [("image", f"data:{source['media_type']};base64,{source['data']}")]
    return []


def expected_atoms(stored: list[dict[str, Any]], dialect: str) -> list[tuple[Any, ...]]:
    repaired, _ = repair_pairing(stored)
    if dialect == "anthropic":  # nothing before the first user turn (the API refuses it)
        first = next((i for i, m in enumerate(repaired) if m["role"] == "user"), len(repaired))
        repaired = [m for i, m in enumerate(repaired) if m["role"] == "system" or i >= first]
    return atoms(repaired)


def read_back(output: Any, dialect: str) -> list[dict[str, Any]]:
    return formats.to_canonical(output, dialect)


@dataclass
class Figures:
    conversations: int = 0
    messages: int = 0
    type_errors: int = 0
    sequence_violations: int = 0
    fields_lost: int = 0
    dropped: int = 0
    by_target: Counter[str] = field(default_factory=Counter)

    def record(self, stored: list[dict[str, Any]]) -> list[str]:
        """Render ``stored`` for every target and check it; the failures, as text."""
        failures: list[str] = []
        self.conversations += 1
        for dialect in DIALECTS:
            rendered = formats.render(stored, dialect)
            validated, refused = type_errors(rendered.output, dialect)
            # a window may leave no user turn: Anthropic has nothing to send, and
            # check says so (anthropic.messages) rather than pass an empty payload
            problems = [p for p in formats.check(rendered.output, dialect)
                        if p.rule != "anthropic.messages" or rendered.output["messages"]]
            lost = Counter(expected_atoms(stored, dialect)) - Counter(
                atoms(read_back(rendered.output, dialect)))
            self.messages += validated
            self.by_target[dialect] += validated
            self.type_errors += refused
            self.sequence_violations += len(problems)
            self.fields_lost += sum(lost.values())
            self.dropped += rendered.dropped
            if refused or problems or lost:
                failures.append(f"{dialect}: {refused} type errors, problems {problems}, "
                                f"lost {dict(lost)}")
        return failures
