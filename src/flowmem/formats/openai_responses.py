"""OpenAI Responses input items in and out (``client.responses.create(input=...)``).

In: the model's side of a turn — reasoning and other items, at most one
assistant ``message``, then ``function_call`` / ``custom_tool_call`` items —
becomes ONE canonical assistant turn declaring every call by its ``call_id``
(so MEM-1/2/3/10 apply by call id through :mod:`flowmem.ids`, MEM-11); a
``function_call_output`` / ``custom_tool_call_output`` becomes a ``tool``
result; a user / system / developer ``message`` one entry (``developer``
stored as ``system`` with ``metadata["openai_role"]``). Item fields flowmem
does not model (item ``id``, ``status``, ``phase``, ...) are kept under
``metadata["responses"]["item"]`` (calls: under ``"responses"`` in the call
entry); reasoning and every other item type are kept verbatim, in order,
under ``metadata["responses"]["items"]`` of the turn they precede; an item
reference (``{"id"}``, ``type`` absent or ``"item_reference"``) is such an item.

Out: the MEM-5 structural repair, then items in that same order; every
``function_call`` is followed by the output paired with it by ``call_id``.
Items that came in as Responses items come out as they came in, field for
field (an assistant message's ``output_text`` parts with their annotations
and logprobs included); an assistant message whose parts came from another
dialect is sent as text, as an easy input message takes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from ..errors import InvalidMessage, MessageTypeError
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
    extras,
    metadata,
    namespace,
    output_within,
    prepare,
    refuse_foreign,
)
from .parts import part_text, responses_part

if TYPE_CHECKING:
    from ..context import TokenCounter

__all__ = ["from_responses", "render_responses", "to_responses"]

_WHERE: Final = "responses"
_CALLS: Final = {"function_call": "function", "custom_tool_call": "custom"}
_OUTPUTS: Final = {"function_call_output", "custom_tool_call_output"}
_MESSAGE_KEYS: Final = frozenset({"role", "content"})
_CALL_KEYS: Final = frozenset({"type", "call_id", "name", "arguments", "input"})
_OUTPUT_KEYS: Final = frozenset({"type", "call_id", "output"})
_ROLES: Final = {"user": "user", "system": "system", "developer": "system",
                 "assistant": "assistant"}


@dataclass
class _Group:
    """The model's side of one turn, being gathered."""

    index: int
    items: list[Any] = field(default_factory=list)
    message: Mapping[str, Any] | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)

    def closed_to(self, kind: str) -> bool:
        """Whether an item of ``kind`` must start a new group (order is kept)."""
        if kind == "call":
            return False
        return self.message is not None or bool(self.calls)

    def entry(self) -> Message:
        meta: dict[str, Any] = {}
        if self.calls:
            meta["tool_calls"] = self.calls
        kept: dict[str, Any] = {}
        if self.message is not None and extras(self.message, _MESSAGE_KEYS):
            kept["item"] = extras(self.message, _MESSAGE_KEYS)
        if self.items:
            kept["items"] = self.items
        if kept:
            meta[RESPONSES] = kept
        content = None if self.message is None else self.message.get("content")
        return canonical_message({"role": "assistant", "content": content, "metadata": meta},
                                 index=self.index, where=_WHERE)


def _required_text(item: Mapping[str, Any], name: str, index: int) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidMessage(f"{item.get('type')} needs a string {name}", index=index,
                             field=name, where=_WHERE)
    return value


def _call(item: Mapping[str, Any], index: int) -> dict[str, Any]:
    name = _required_text(item, "name", index)
    entry: dict[str, Any] = {"id": _required_text(item, "call_id", index),
                             "type": _CALLS[item["type"]]}
    if entry["type"] == "custom":
        entry["custom"] = {"name": name, "input": item.get("input", "")}
    else:
        entry["function"] = {"name": name, "arguments": item.get("arguments", "")}
    if extras(item, _CALL_KEYS):
        entry[RESPONSES] = extras(item, _CALL_KEYS)
    return entry


def _output(item: Mapping[str, Any], index: int) -> Message:
    meta: dict[str, Any] = {"tool_call_id": _required_text(item, "call_id", index)}
    if extras(item, _OUTPUT_KEYS):
        meta[RESPONSES] = {"item": extras(item, _OUTPUT_KEYS)}
    return canonical_message({"role": "tool", "content": item.get("output"), "metadata": meta},
                             index=index, where=_WHERE)


def _input_message(item: Mapping[str, Any], index: int) -> Message:
    role = item["role"]
    meta: dict[str, Any] = {}
    if role == "developer":
        meta[ORIGINAL_ROLE] = "developer"
    if extras(item, _MESSAGE_KEYS):
        meta[RESPONSES] = {"item": extras(item, _MESSAGE_KEYS)}
    return canonical_message({"role": _ROLES[role], "content": item.get("content"),
                              "metadata": meta}, index=index, where=_WHERE)


def _is_reference(item: Mapping[str, Any]) -> bool:
    """An item reference: ``{"id"}`` with ``type`` absent or ``"item_reference"``."""
    return item.get("type") in (None, "item_reference") and "role" not in item and \
        isinstance(item.get("id"), str)


def _is_message(item: Mapping[str, Any], index: int) -> bool:
    if item.get("type") not in (None, "message") or _is_reference(item):
        return False
    role = item.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise InvalidMessage(f"role must be one of {sorted(_ROLES)}, got {item.get('role')!r}",
                             index=index, field="role", where=_WHERE)
    return True


def from_responses(items: Sequence[Mapping[str, Any]] | Mapping[str, Any] | str) -> list[Message]:
    """Responses input items (or an ``input`` string) as canonical entries (strict)."""
    if isinstance(items, str):
        return [canonical_message({"role": "user", "content": items}, where=_WHERE)]
    out: list[Message] = []
    group: _Group | None = None
    for index, item in enumerate(as_items(items, _WHERE)):
        if not isinstance(item, Mapping):
            raise MessageTypeError(f"expected an item mapping, got {type(item).__name__}",
                                   index=index, where=_WHERE)
        refuse_foreign(item, index, _WHERE)
        kind = item.get("type")
        if kind is not None and not isinstance(kind, str):
            raise MessageTypeError(f"type must be a string, got {type(kind).__name__}",
                                   index=index, field="type", where=_WHERE)
        is_message = _is_message(item, index)
        step = ("assistant" if is_message and item["role"] == "assistant" else
                "input" if is_message or kind in _OUTPUTS else
                "call" if kind in _CALLS else "item")
        if group is not None and (step == "input" or group.closed_to(step)):
            out.append(group.entry())
            group = None
        if step == "input":
            out.append(_input_message(item, index) if is_message else _output(item, index))
            continue
        group = group or _Group(index)
        if step == "assistant":
            group.message = item
        elif step == "call":
            group.calls.append(_call(item, index))
        else:
            group.items.append(item)
    if group is not None:
        out.append(group.entry())
    return out


# --------------------------------------------------------------------------- out

def _parts(message: Message, role: str, losses: Losses) -> Any:
    content = content_parts(message.get("content"))
    if isinstance(content, list):
        parts = [p for p in (responses_part(x, role, losses) for x in content) if p is not None]
        return parts or None
    return content


def _blank(message: Message) -> bool:
    kept = namespace(message, RESPONSES)
    return not kept.get("items") and not kept.get("item") and \
        _parts(message, "assistant", Losses()) in (None, "")


def _lose_chat_fields(message: Message, names: tuple[str, ...], losses: Losses) -> None:
    meta = metadata(message)
    for name in names:
        if meta.get(name) is not None:
            losses.lose(f"chat {name}")
    if namespace(message, ANTHROPIC):
        losses.lose("anthropic field", len(namespace(message, ANTHROPIC)))


def _input(message: Message, losses: Losses) -> dict[str, Any]:
    role = message["role"]
    if role == "system" and metadata(message).get(ORIGINAL_ROLE) == "developer":
        role = "developer"
    _lose_chat_fields(message, ("name",), losses)
    content = _parts(message, message["role"], losses)
    item = dict(namespace(message, RESPONSES).get("item") or {})
    item.update(role=role, content="" if content is None else content)
    return item


def _own_parts(message: Message, item: Mapping[str, Any]) -> bool:
    """Whether an assistant message's parts are sent as parts: an output message
    (``id`` and ``status``), or parts that came in as Responses ``output_text``
    (kept as given: annotations, logprobs). Parts of another dialect (Chat
    ``text``, Anthropic blocks) are joined, as an easy input message takes text."""
    if "id" in item and "status" in item:
        return True
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(p, Mapping) and p.get("type") == "output_text" for p in content)


def _assistant_message(message: Message, losses: Losses) -> dict[str, Any] | None:
    item = dict(namespace(message, RESPONSES).get("item") or {})
    content = _parts(message, "assistant", losses)
    if content is None or content == "":
        if item:
            losses.lose("responses item field", len(item))
        return None
    if isinstance(content, list) and not _own_parts(message, item):
        texts = [part_text(p) for p in content]  # an easy input message takes text
        losses.lose("refusal part", sum(t is None for t in texts))
        content = "\n".join(t for t in texts if t is not None)
    item.update(role="assistant", content=content)
    return item


def _call_item(entry: Mapping[str, Any], losses: Losses) -> dict[str, Any]:
    if isinstance(entry.get(ANTHROPIC), Mapping):
        losses.lose("anthropic call field", len(entry[ANTHROPIC]))
    item = dict(entry.get(RESPONSES) or {})
    if entry.get("type") == "custom":
        item.update(type="custom_tool_call", call_id=call_id(entry), name=call_name(entry),
                    input=str(entry["custom"].get("input", "")))
    else:
        item.update(type="function_call", call_id=call_id(entry), name=call_name(entry),
                    arguments=call_arguments(entry))
    return item


def _assistant(message: Message, customs: set[str], losses: Losses) -> list[dict[str, Any]]:
    _lose_chat_fields(message, ("name", "refusal", "audio", "function_call"), losses)
    out = [dict(item) for item in namespace(message, RESPONSES).get("items") or ()]
    said = _assistant_message(message, losses)
    if said is not None:
        out.append(said)
    for entry in metadata(message).get("tool_calls") or ():
        out.append(_call_item(entry, losses))
        if entry.get("type") == "custom":
            customs.add(str(call_id(entry)))
    return out


def _result(message: Message, customs: set[str], losses: Losses) -> dict[str, Any]:
    found = str(result_id(message))
    _lose_chat_fields(message, (), losses)
    item = dict(namespace(message, RESPONSES).get("item") or {})
    output = _parts(message, "tool", losses)
    item.update(type="custom_tool_call_output" if found in customs else "function_call_output",
                call_id=found, output="" if output is None else output)
    return item


def render_responses(history: Sequence[Message]) -> Rendered:
    """``history`` as sendable Responses input items, with what was dropped (MEM-5)."""
    losses = Losses()
    repaired, dropped = prepare(history, carried=carried_call, blank=_blank,
                                lose_turn=lambda turn, lost: _assistant(turn, set(), lost),
                                losses=losses)
    customs: set[str] = set()
    output: list[dict[str, Any]] = []
    for message in repaired:
        role = message["role"]
        if role == "assistant":
            output.extend(_assistant(message, customs, losses))
        elif role == "tool":
            output.append(_result(message, customs, losses))
        else:
            output.append(_input(message, losses))
    return Rendered(output, dropped + losses.counts.total(), dict(losses.counts))


def to_responses(history: Sequence[Message], *, max_tokens: int | None = None,
                 counter: TokenCounter | None = None, keep_system: bool = True,
                   ) -> list[dict[str, Any]]:
    """``history`` as sendable ``input`` items for ``client.responses.create``.

    ``max_tokens=N``: only the newest whole turns whose count (by ``counter``,
    on this output) is within ``N`` (:func:`flowmem.context.fit`, which also
    says the count and what was left out).
    """
    result: list[dict[str, Any]] = output_within(
        history, "responses", render_responses, max_tokens, counter, keep_system)
    return result
