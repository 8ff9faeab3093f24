"""Anthropic Messages in and out (``client.messages.create(**payload, ...)``).

In: ``system`` becomes a leading ``system`` entry; an assistant turn's
``tool_use`` blocks become its call entries (``input`` as JSON text in
``function.arguments``, extras such as ``cache_control`` under
``"anthropic"`` in the entry) and its other blocks (text, thinking with its
signature, ...) stay its content; a user turn's ``tool_result`` blocks become
``tool`` results (``is_error``, ``cache_control``, ... under
``metadata["anthropic"]``) and its other blocks a ``user`` entry. So a
re-fired ``tool_result`` is dropped (MEM-1), an interrupted ``tool_use`` healed
(MEM-3) and a late result replaces its placeholder (MEM-10), by id (MEM-11).

Out: the MEM-5 structural repair, ``system`` lifted out, empty user turns and
anything before the first user turn dropped (counted), every ``tool_result``
in the user turn right after its ``tool_use`` turn, adjacent same-role turns
merged into one turn of several blocks (strict alternation).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from ..errors import InvalidMessage, MessageTypeError
from ..ids import call_id, result_id
from ..messages import Message, canonical_message
from ._common import (
    ANTHROPIC,
    RESPONSES,
    Losses,
    Rendered,
    as_items,
    call_arguments,
    call_name,
    content_parts,
    extras,
    metadata,
    namespace,
    output_within,
    prepare,
    refuse_foreign,
)
from .parts import anthropic_block, part_text

if TYPE_CHECKING:
    from ..context import TokenCounter

__all__ = ["from_anthropic", "render_anthropic", "to_anthropic"]

_WHERE: Final = "anthropic"
_USE_KEYS: Final = frozenset({"type", "id", "name", "input"})
_RESULT_KEYS: Final = frozenset({"type", "tool_use_id", "content"})
_MESSAGE_KEYS: Final = frozenset({"role", "content"})

Block = dict[str, Any]


def _blocks(message: Mapping[str, Any], index: int) -> list[Mapping[str, Any]]:
    content: list[Any] = message["content"]
    for i, block in enumerate(content):
        if not isinstance(block, Mapping):
            raise MessageTypeError(f"a content block must be a mapping, got "
                                   f"{type(block).__name__}", index=index,
                                   field=f"content[{i}]", where=_WHERE)
    return content


def _call(block: Mapping[str, Any], index: int) -> dict[str, Any]:
    if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
        raise InvalidMessage("tool_use needs a string id and name", index=index,
                             field="content", where=_WHERE)
    entry: dict[str, Any] = {"id": block["id"], "type": "function", "function": {
        "name": block["name"],
        "arguments": json.dumps(block.get("input", {}), ensure_ascii=False)}}
    if extras(block, _USE_KEYS):
        entry[ANTHROPIC] = extras(block, _USE_KEYS)
    return entry


def _result(block: Mapping[str, Any], index: int) -> Message:
    meta: dict[str, Any] = {"tool_call_id": block.get("tool_use_id")}
    if extras(block, _RESULT_KEYS):
        meta[ANTHROPIC] = extras(block, _RESULT_KEYS)
    return canonical_message({"role": "tool", "content": block.get("content"),
                              "metadata": meta}, index=index, where=_WHERE)


def _user(message: Mapping[str, Any], index: int, meta: dict[str, Any]) -> list[Message]:
    out: list[Message] = []
    pending: list[Mapping[str, Any]] = []

    def flush() -> None:
        if pending:
            out.append(canonical_message({"role": "user", "content": list(pending),
                                          "metadata": meta}, index=index, where=_WHERE))
            pending.clear()

    for block in _blocks(message, index):
        if block.get("type") == "tool_result":
            flush()
            out.append(_result(block, index))
        else:
            pending.append(block)
    flush()
    return out


def _assistant(message: Mapping[str, Any], index: int, meta: dict[str, Any]) -> Message:
    blocks = _blocks(message, index)
    calls = [_call(b, index) for b in blocks if b.get("type") == "tool_use"]
    content = [b for b in blocks if b.get("type") != "tool_use"] or None
    if calls:
        meta = {**meta, "tool_calls": calls}
    return canonical_message({"role": "assistant", "content": content, "metadata": meta},
                             index=index, where=_WHERE)


def _turn(message: Any, index: int) -> list[Message]:
    if not isinstance(message, Mapping):
        raise MessageTypeError(f"expected a message mapping, got {type(message).__name__}",
                               index=index, where=_WHERE)
    refuse_foreign(message, index, _WHERE)
    role, content = message.get("role"), message.get("content")
    if role not in ("user", "assistant", "system"):
        raise InvalidMessage(f"role must be 'user' or 'assistant', got {role!r}",
                             index=index, field="role", where=_WHERE)
    meta = {ANTHROPIC: {"message": extras(message, _MESSAGE_KEYS)}} \
        if extras(message, _MESSAGE_KEYS) else {}
    if not isinstance(content, list) or role == "system":
        return [canonical_message({"role": role, "content": content, "metadata": meta},
                                  index=index, where=_WHERE)]
    return _user(message, index, meta) if role == "user" else [_assistant(message, index, meta)]


def from_anthropic(messages: Sequence[Mapping[str, Any]] | Mapping[str, Any],
                   system: str | Sequence[Mapping[str, Any]] | None = None) -> list[Message]:
    """Anthropic ``messages`` (and ``system``) as canonical entries (strict)."""
    out: list[Message] = []
    if system is not None:
        given = list(system) if isinstance(system, list | tuple) else system
        out.append(canonical_message({"role": "system", "content": given},
                                     where=f"{_WHERE}.system"))
    for index, message in enumerate(as_items(messages, _WHERE)):
        out.extend(_turn(message, index))
    return out


# --------------------------------------------------------------------------- out

def _carried(entry: Mapping[str, Any]) -> bool:
    return entry.get("type") in (None, "function") and call_name(entry) is not None


def _content(message: Message, role: str, losses: Losses) -> str | list[Block] | None:
    content = content_parts(message.get("content"))
    if isinstance(content, list):
        return [b for b in (anthropic_block(p, role, losses) for p in content) if b is not None]
    return content


def _empty(content: str | list[Block] | None) -> bool:
    return content is None or len(content) == 0


def _blank(message: Message) -> bool:
    return _empty(_content(message, "assistant", Losses()))


def _keep(messages: list[Message], losses: Losses) -> list[Message]:
    """Empty user turns (with what made them empty) and every turn before the first
    user turn are dropped (counted)."""
    kept: list[Message] = []
    seen_user = False
    for message in messages:
        role = message["role"]
        parts = Losses()
        if role == "user" and _empty(_content(message, "user", parts)):
            losses.merge(parts)
            losses.lose("empty user turn")
        elif role == "system" or seen_user or role == "user":
            seen_user = seen_user or role == "user"
            kept.append(message)
        else:
            losses.lose("turn before the first user turn")
    return kept


def _lose_foreign(message: Message, names: tuple[str, ...], losses: Losses) -> None:
    meta = metadata(message)
    for name in names:
        if meta.get(name) is not None:
            losses.lose(f"chat {name}")
    kept = namespace(message, RESPONSES)
    for key in ("items", "item"):
        if kept.get(key):
            losses.lose(f"responses {key}", len(kept[key]))


def _as_blocks(content: str | list[Block] | None) -> list[Block]:
    if content is None or content == "":
        return []
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def _tool_use(entry: Mapping[str, Any], losses: Losses) -> Block:
    if isinstance(entry.get(RESPONSES), Mapping):
        losses.lose("responses call field", len(entry[RESPONSES]))
    try:
        given = json.loads(call_arguments(entry))
    except ValueError:
        given = None
    if not isinstance(given, dict):
        losses.lose("arguments that are not a JSON object")
        given = {}
    block: Block = dict(entry.get(ANTHROPIC) or {})
    block.update(type="tool_use", id=call_id(entry), name=call_name(entry), input=given)
    return block


def _assistant_turn(message: Message, losses: Losses) -> str | list[Block] | None:
    _lose_foreign(message, ("name", "refusal", "audio", "function_call"), losses)
    content = _content(message, "assistant", losses)
    calls = metadata(message).get("tool_calls")
    if not calls:
        return content
    return _as_blocks(content) + [_tool_use(entry, losses) for entry in calls]


def _tool_result(message: Message, losses: Losses) -> Block:
    _lose_foreign(message, (), losses)
    block: Block = {"type": "tool_result", "tool_use_id": result_id(message)}
    content = _content(message, "tool", losses)
    if content is not None:
        block["content"] = content
    block.update(namespace(message, ANTHROPIC))
    return block


def _system(messages: list[Message], losses: Losses) -> str | list[Block] | None:
    if len(messages) == 1 and isinstance(messages[0].get("content"), str):
        _lose_foreign(messages[0], ("name",), losses)
        text: str = messages[0]["content"]
        if text:
            return text
        losses.lose("empty text block")
        return None
    blocks: list[Block] = []
    for message in messages:
        _lose_foreign(message, ("name",), losses)
        for block in _as_blocks(_content(message, "system", losses)):
            if part_text(block) is None:
                losses.lose(f"{block.get('type')} part in system")
            elif block["text"] == "":
                losses.lose("empty text block")
            else:
                blocks.append(block)
    return blocks or None


def _merge(turns: list[dict[str, Any]], role: str, content: Any) -> None:
    if turns and turns[-1]["role"] == role:
        turns[-1]["content"] = _as_blocks(turns[-1]["content"]) + _as_blocks(content)
    else:
        turns.append({"role": role, "content": content})


def render_anthropic(history: Sequence[Message]) -> Rendered:
    """``history`` as a sendable Anthropic payload, with what was dropped (MEM-5)."""
    losses = Losses()
    repaired, dropped = prepare(history, carried=_carried, blank=_blank,
                                lose_turn=_assistant_turn, keep=lambda ms: _keep(ms, losses),
                                losses=losses)
    systems = [m for m in repaired if m["role"] == "system"]
    turns: list[dict[str, Any]] = []
    for message in repaired:
        role = message["role"]
        if role == "tool":
            _merge(turns, "user", [_tool_result(message, losses)])
        elif role == "user":
            _lose_foreign(message, ("name",), losses)
            _merge(turns, "user", _content(message, "user", losses))
        elif role == "assistant":
            _merge(turns, "assistant", _assistant_turn(message, losses))
    payload: dict[str, Any] = {"messages": turns}
    system = _system(systems, losses) if systems else None
    if system is not None:
        payload = {"system": system, **payload}
    return Rendered(payload, dropped + losses.counts.total(), dict(losses.counts))


def to_anthropic(history: Sequence[Message], *, max_tokens: int | None = None,
                 counter: TokenCounter | None = None, keep_system: bool = True) -> dict[str, Any]:
    """``history`` as ``{"system"?, "messages"}`` for ``client.messages.create(**payload)``.

    ``max_tokens=N``: only the newest whole turns whose count (by ``counter``,
    on this output) is within ``N`` (:func:`flowmem.context.fit`, which also
    says the count and what was left out).
    """
    result: dict[str, Any] = output_within(
        history, "anthropic", render_anthropic, max_tokens, counter, keep_system)
    return result
