"""OpenAI Chat Completions messages in and out (``client.chat.completions.create``).

In: every message becomes one canonical entry (:func:`flowmem.messages.canonical_message`):
``tool_calls`` and ``tool_call_id`` go into ``metadata`` where the buffer rules read
them (MEM-1/2/3/10 through :mod:`flowmem.ids`, MEM-11), ``name``, ``refusal``,
``audio`` and ``function_call`` stay in ``metadata`` under their own names,
content parts stay a list. ``developer`` is stored as ``system`` and the
deprecated ``function`` role as an id-less ``tool`` result, both with
``metadata["openai_role"]`` recording the original role.

Out: the MEM-5 structural repair (:func:`flowmem.normalize.repair_pairing`),
then each entry in the Chat shape: call entries with ``id``, ``type:
"function"`` and ``function.arguments`` as JSON text, ``developer`` restored,
parts kept where Chat allows them for the role. What Chat cannot carry
(thinking blocks, Responses reasoning items, Anthropic ``is_error`` /
``cache_control``, id-less ``function`` results) is dropped and counted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from ..ids import call_id, result_id
from ..messages import Message, canonical_message
from ._common import (
    ANTHROPIC,
    ORIGINAL_ROLE,
    RESPONSES,
    Losses,
    Rendered,
    as_items,
    call_arguments,
    call_name,
    carried_call,
    content_parts,
    metadata,
    namespace,
    output_within,
    prepare,
)
from .parts import chat_part

if TYPE_CHECKING:
    from ..context import TokenCounter

__all__ = ["from_openai_chat", "render_openai_chat", "to_openai_chat"]

_STORED_AS: Final = {"developer": "system", "function": "tool"}
_ASSISTANT_FIELDS: Final = ("name", "refusal", "audio", "function_call")


def from_openai_chat(messages: Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> list[Message]:
    """OpenAI Chat messages as canonical entries (strict: all or nothing).

    Raises :class:`~flowmem.errors.InvalidMessage` naming ``openai[index].field``.
    """
    out: list[Message] = []
    for index, message in enumerate(as_items(messages, "openai")):
        role = message.get("role") if isinstance(message, Mapping) else None
        if isinstance(role, str) and role in _STORED_AS:  # any other role: checked below
            given = message.get("metadata")
            marked = {**(given if isinstance(given, Mapping) else {}), ORIGINAL_ROLE: role}
            message = {**message, "role": _STORED_AS[role], "metadata": marked}
        out.append(canonical_message(message, index=index, where="openai"))
    return out


def _content(message: Message, role: str, losses: Losses) -> Any:
    content = content_parts(message.get("content"))
    if isinstance(content, list):
        parts = [p for p in (chat_part(x, role, losses) for x in content) if p is not None]
        content = parts or None
    if content is None and role != "assistant":
        return ""
    return content


def _blank(message: Message) -> bool:
    meta = metadata(message)
    if any(meta.get(name) is not None for name in _ASSISTANT_FIELDS[1:]):
        return False
    return _content(message, "assistant", Losses()) in (None, "")


def _call(entry: Mapping[str, Any], losses: Losses) -> dict[str, Any]:
    for dialect in (ANTHROPIC, RESPONSES):
        if isinstance(entry.get(dialect), Mapping):
            losses.lose(f"{dialect} call field", len(entry[dialect]))
    if entry.get("type") == "custom":
        body = entry["custom"]
        return {"id": call_id(entry), "type": "custom",
                "custom": {"name": body["name"], "input": str(body.get("input", ""))}}
    return {"id": call_id(entry), "type": "function",
            "function": {"name": call_name(entry), "arguments": call_arguments(entry)}}


def _lose_foreign(message: Message, losses: Losses) -> None:
    items = namespace(message, RESPONSES)
    if items.get("items"):
        losses.lose("responses item", len(items["items"]))
    if items.get("item"):
        losses.lose("responses item field", len(items["item"]))
    if namespace(message, ANTHROPIC):
        losses.lose("anthropic field", len(namespace(message, ANTHROPIC)))


def _message(message: Message, losses: Losses) -> dict[str, Any]:
    role, meta = message["role"], metadata(message)
    _lose_foreign(message, losses)
    if role == "tool":
        return {"role": "tool", "tool_call_id": result_id(message),
                "content": _content(message, "tool", losses)}
    out: dict[str, Any] = {"role": role, "content": _content(message, role, losses)}
    if role == "system" and meta.get(ORIGINAL_ROLE) == "developer":
        out["role"] = "developer"
    names = _ASSISTANT_FIELDS if role == "assistant" else ("name",)
    out.update({name: meta[name] for name in names if meta.get(name) is not None})
    calls = meta.get("tool_calls") if role == "assistant" else None
    if calls:
        out["tool_calls"] = [_call(entry, losses) for entry in calls]
    return out


def render_openai_chat(history: Sequence[Message]) -> Rendered:
    """``history`` as sendable OpenAI Chat messages, with what was dropped (MEM-5)."""
    losses = Losses()
    repaired, dropped = prepare(history, carried=carried_call, blank=_blank,
                                lose_turn=_message, losses=losses)
    output = [_message(message, losses) for message in repaired]
    return Rendered(output, dropped + losses.counts.total(), dict(losses.counts))


def to_openai_chat(history: Sequence[Message], *, max_tokens: int | None = None,
                   counter: TokenCounter | None = None, keep_system: bool = True,
                   ) -> list[dict[str, Any]]:
    """``history`` as sendable ``messages`` for ``client.chat.completions.create``.

    ``max_tokens=N``: only the newest whole turns whose count (by ``counter``,
    on this output) is within ``N`` (:func:`flowmem.context.fit`, which also
    says the count and what was left out).
    """
    result: list[dict[str, Any]] = output_within(
        history, "openai", render_openai_chat, max_tokens, counter, keep_system)
    return result
