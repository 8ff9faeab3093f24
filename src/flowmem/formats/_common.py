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
  block (``is_error``, ``cache_control``, ...);
- :data:`OPAQUE` (``"opaque"``): an item flowmem cannot interpret, kept
  verbatim in an otherwise empty assistant entry (:func:`opaque_entry`): it
  declares and answers no call, so the buffer rules skip it, and no target
  carries it (rendering counts it as ``"opaque item"``).

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

from ..errors import InvalidMessage, MessageTypeError
from ..ids import call_entries
from ..messages import Message, canonical_messages, coerce_content
from ..normalize import repair_pairing

__all__ = [
    "ANTHROPIC",
    "OPAQUE",
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
    "opaque_entry",
    "opaque_item",
    "prepare",
    "refuse_foreign",
]

ORIGINAL_ROLE: Final = "openai_role"
RESPONSES: Final = "responses"
ANTHROPIC: Final = "anthropic"
OPAQUE: Final = "opaque"

_CONVERTERS: Final = {
    "openai": "flowmem.formats.from_openai_chat (format='openai')",
    "responses": "flowmem.formats.from_responses (format='responses')",
}
_CHAT_ROLES: Final = frozenset({"tool", "function"})
_CHAT_FIELDS: Final = ("tool_calls", "function_call", "tool_call_id")


class Losses:
    """What a target cannot carry, counted by what it was (never turned into text)."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def lose(self, what: str, count: int = 1) -> None:
        """Count ``count`` losses of kind ``what`` (a zero count lists nothing)."""
        if count > 0:
            self.counts[what] += count

    def merge(self, other: Losses) -> None:
        """Add ``other``'s counts to these."""
        self.counts.update(other.counts)


@dataclass(frozen=True)
class Rendered:
    """A history rendered for a provider (:func:`flowmem.formats.render`).

    ``output`` is what the provider SDK takes (a message list, or for
    Anthropic ``{"system"?, "messages"}``); ``dropped`` counts the messages
    and call declarations the MEM-5 repair removed plus every field, part or
    item the target cannot carry; ``lost`` breaks the latter down by kind
    (never a zero count). A turn the repair removes because all it carried is
    something the target cannot carry counts once as a removed message and
    names what it carried in ``lost``.
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


_BLANK: Final = "flowmem:blank"
"""Top-level mark of a blank assistant turn inside :func:`prepare` (renderers read
``role``, ``content`` and ``metadata`` only)."""


def opaque_entry(item: Mapping[str, Any]) -> Message:
    """A canonical entry holding ``item`` verbatim, for the rules to skip (module doc)."""
    return canonical_messages({"role": "assistant", "content": None,
                               "metadata": {OPAQUE: item}}, where="opaque")[0]


def opaque_item(message: Mapping[str, Any]) -> Any:
    """The item an :func:`opaque_entry` holds, else ``None``."""
    found = metadata(message).get(OPAQUE)
    return found if message.get("role") == "assistant" and isinstance(found, dict) else None


def _without_calls(message: Message) -> Message:
    return {**message, "metadata": {k: v for k, v in metadata(message).items()
                                    if k != "tool_calls"}}


def prepare(history: Sequence[Message] | Any, *, carried: Callable[[Mapping[str, Any]], bool],
            blank: Callable[[Message], bool],
            lose_turn: Callable[[Message, Losses], object],
            keep: Callable[[list[Message]], list[Message]] | None = None,
            losses: Losses) -> tuple[list[Message], int]:
    """A history validated (strict) and repaired for a target (MEM-5 steps 2-4).

    Opaque entries (:func:`opaque_entry`) are removed and counted first, then
    call entries the target cannot carry (their results then
    fall as orphans), ``keep`` may cut messages the target refuses (counted by
    the caller), and :func:`flowmem.normalize.repair_pairing` does the rest.
    An assistant turn the repair drops because it is ``blank`` (nothing the
    target can send, no call left) is one drop of the repair; what it carried
    (a refusal, audio, a part, an item) is counted too, by kind, by
    ``lose_turn(turn without its calls, losses)``, the renderer of one turn.
    Returns the repaired messages and the repair's drop count.
    """
    messages = canonical_messages(list(history), where="history")
    readable = [m for m in messages if opaque_item(m) is None]
    losses.lose("opaque item", len(messages) - len(readable))
    messages = [_strip_calls(m, carried, losses) if m["role"] == "assistant" else m
                for m in readable]
    if keep is not None:
        messages = keep(messages)
    marked = [{**m, _BLANK: index} if m["role"] == "assistant" and blank(m) else m
              for index, m in enumerate(messages)]
    repaired, dropped = repair_pairing(marked, blank=lambda m: _BLANK in m)
    kept = {m[_BLANK] for m in repaired if _BLANK in m}
    for message in marked:
        if _BLANK in message and message[_BLANK] not in kept:
            lose_turn(_without_calls(message), losses)
    return repaired, dropped


def _foreign(message: Mapping[str, Any], where: str) -> tuple[str, str, str] | None:
    """``(field, what it is, its dialect)`` when ``message`` belongs to OpenAI Chat
    (or, for ``where="anthropic"``, is an OpenAI Responses item), else ``None``."""
    role = message.get("role")
    if isinstance(role, str) and role in _CHAT_ROLES:
        return "role", f"role {role!r} is OpenAI Chat's", "openai"
    for name in _CHAT_FIELDS:
        if name in message:
            return name, f"{name} is an OpenAI Chat field", "openai"
    if where == ANTHROPIC and role is None and isinstance(message.get("type"), str):
        return "type", f"this is an OpenAI Responses item (type {message['type']!r})", \
            "responses"
    return None


def refuse_foreign(message: Mapping[str, Any], index: int, where: str) -> None:
    """Refuse a message of another dialect than ``where``, naming its converter.

    Kept as opaque extras, another dialect's tool calls would be declared to
    no rule (never deduplicated, MEM-1/2, never healed, MEM-3) and dropped by
    every renderer; so they are an :class:`~flowmem.errors.InvalidMessage`
    locating the field (``where[index].field``).
    """
    found = _foreign(message, where)
    if found is not None:
        field_name, what, dialect = found
        raise InvalidMessage(f"{what}: convert the messages with {_CONVERTERS[dialect]} "
                             "so the tool pairing is kept", index=index, field=field_name,
                             where=where)


def as_items(messages: Any, where: str) -> list[Any]:
    """A list of messages/items: a lone mapping is one, a list or tuple is itself."""
    if isinstance(messages, Mapping):
        return [messages]
    if isinstance(messages, list | tuple):
        return list(messages)
    raise MessageTypeError(f"expected a list of messages, got {type(messages).__name__}",
                           where=where)


def output_within(history: Sequence[Message], format: str, render: Callable[[Any], Rendered],
                  max_tokens: int | None, counter: Any, keep_system: bool) -> Any:
    """What a ``to_*`` function returns: the whole rendering, or with ``max_tokens`` only
    the newest whole turns that fit (:func:`flowmem.context.fit`, which also says the
    count and what was left out)."""
    if max_tokens is None:
        return render(history).output
    from ..context import fit

    return fit(history, max_tokens, counter=counter, format=format,
               keep_system=keep_system).output
