"""What the three dialect converters share: the drop tally, the result, the
canonical accessors and the MEM-5 preparation of a history for a target.

Canonical entries (see :mod:`flowmem.messages`) keep provider extras under
documented ``metadata`` keys:

- OpenAI Chat fields keep their own names (``name``, ``refusal``, ``audio``,
  ``function_call``), as :func:`flowmem.messages.canonical_message` already
  stores them; :data:`ORIGINAL_ROLE` (``"openai_role"``) records ``developer``
  (stored as ``system``) and ``function`` (stored as ``tool``, no id);
- :data:`RESPONSES` (``"responses"``): ``{"item": {...}}`` the extra keys of
  the Responses item a message came from, and on an assistant turn
  ``{"items": [...]}`` the reasoning and other items that preceded its
  message and calls;
- :data:`ANTHROPIC` (``"anthropic"``): the extra keys of a ``tool_result``
  block (``is_error``, ``cache_control``, ...).

A call entry is always the OpenAI Chat shape ``{"id", "type", "function":
{"name", "arguments"}}`` (or ``type: "custom"``), with the extras of the
Responses item or Anthropic block it came from under ``"responses"`` or
``"anthropic"`` inside the entry.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ..errors import MessageTypeError
from ..ids import call_entries
from ..messages import Message, canonical_messages, coerce_content
from ..normalize import repair_pairing

__all__ = [
    "ANTHROPIC",
    "ORIGINAL_ROLE",
    "RESPONSES",
    "Losses",
    "Rendered",
    "as_items",
    "call_arguments",
    "call_name",
    "carried_call",
    "content_parts",
    "extras",
    "metadata",
    "namespace",
    "prepare",
]

ORIGINAL_ROLE: Final = "openai_role"
RESPONSES: Final = "responses"
ANTHROPIC: Final = "anthropic"


class Losses:
    """What a target cannot carry, counted by what it was (never turned into text)."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def lose(self, what: str, count: int = 1) -> None:
        self.counts[what] += count


@dataclass(frozen=True)
class Rendered:
    """A history rendered for a provider (:func:`flowmem.formats.render`).

    ``output`` is what the provider SDK takes (a message list, or for
    Anthropic ``{"system"?, "messages"}``); ``dropped`` counts the messages
    and call declarations the MEM-5 repair removed plus every field, part or
    item the target cannot carry; ``lost`` breaks the latter down by kind.
    """

    output: Any
    dropped: int
    lost: dict[str, int] = field(default_factory=dict)


def metadata(message: Mapping[str, Any]) -> dict[str, Any]:
    """A canonical message's metadata (``{}`` when absent)."""
    found = message.get("metadata")
    return found if isinstance(found, dict) else {}


def namespace(message: Mapping[str, Any], name: str) -> dict[str, Any]:
    """``metadata[name]`` when it is a mapping, else ``{}``."""
    found = metadata(message).get(name)
    return found if isinstance(found, dict) else {}


def extras(source: Mapping[str, Any], known: frozenset[str]) -> dict[str, Any]:
    """The keys of ``source`` outside ``known`` (kept losslessly in the canonical entry)."""
    return {k: v for k, v in source.items() if k not in known}


def content_parts(content: Any) -> str | list[dict[str, Any]] | None:
    """Canonical content as a target sees it: text, a list of typed parts, or ``None``.

    A list counts as parts only when every element is a mapping with a string
    ``type``; any other non-text value becomes text as MEM-5 step 1 says
    (:func:`flowmem.messages.coerce_content`).
    """
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list) and all(
            isinstance(p, dict) and isinstance(p.get("type"), str) for p in content):
        return content
    return coerce_content(content)


def call_name(entry: Mapping[str, Any]) -> str | None:
    """The tool name of a call entry (function or custom), or ``None``."""
    body = entry.get("custom") if entry.get("type") == "custom" else entry.get("function")
    name = body.get("name") if isinstance(body, Mapping) else None
    return name if isinstance(name, str) and name else None



def carried_call(entry: Mapping[str, Any]) -> bool:
    """A call entry OpenAI Chat and Responses can carry: a named function or custom tool."""
    return entry.get("type") in (None, "function", "custom") and call_name(entry) is not None

def call_arguments(entry: Mapping[str, Any]) -> str:
    """A function call's arguments as JSON text (a mapping is serialized; absent is ``{}``)."""
    body = entry.get("function")
    arguments = body.get("arguments") if isinstance(body, Mapping) else None
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, ensure_ascii=False)


def _strip_calls(message: Message, carried: Callable[[Mapping[str, Any]], bool],
                 losses: Losses) -> Message:
    entries = call_entries(message)
    kept = [e for e in entries if isinstance(e, Mapping) and carried(e)]
    if len(kept) == len(entries):
        return message
    losses.lose("tool call the target cannot carry", len(entries) - len(kept))
    meta = {k: v for k, v in metadata(message).items() if k != "tool_calls"}
    if kept:
        meta["tool_calls"] = kept
    return {**message, "metadata": meta}


def prepare(history: Sequence[Message] | Any, *, carried: Callable[[Mapping[str, Any]], bool],
            blank: Callable[[Message], bool],
            keep: Callable[[list[Message]], list[Message]] | None = None,
            losses: Losses) -> tuple[list[Message], int]:
    """A history validated (strict) and repaired for a target (MEM-5 steps 2-4).

    Call entries the target cannot carry are removed first (their results then
    fall as orphans), ``keep`` may cut messages the target refuses (counted by
    the caller), and :func:`flowmem.normalize.repair_pairing` does the rest.
    Returns the repaired messages and the repair's drop count.
    """
    messages = canonical_messages(list(history), where="history")
    messages = [_strip_calls(m, carried, losses) if m["role"] == "assistant" else m
                for m in messages]
    if keep is not None:
        messages = keep(messages)
    return repair_pairing(messages, blank=blank)


def as_items(messages: Any, where: str) -> list[Any]:
    """A list of messages/items: a lone mapping is one, a list or tuple is itself."""
    if isinstance(messages, Mapping):
        return [messages]
    if isinstance(messages, list | tuple):
        return list(messages)
    raise MessageTypeError(f"expected a list of messages, got {type(messages).__name__}",
                           where=where)
