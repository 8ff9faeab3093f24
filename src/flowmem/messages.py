"""Messages: the canonical stored shape, strict validation, content coercion.

The buffer stores every message in one canonical shape::

    {"role": "assistant", "content": ..., "metadata": {"tool_calls": [...], ...}}

with tool pairing fields (``tool_calls``, ``tool_call_id``, ``healed``) and
every other provider field (``name``, ...) inside ``metadata``. Messages come
in either that shape or the flat provider shape (OpenAI Chat: top-level
``tool_calls`` entries ``{"id", "type": "function", "function": {...}}``,
top-level ``tool_call_id``, ``content: null``); :func:`canonical_message`
turns both into the canonical shape, keeping provider fields intact.

Validation here is strict (an append is all or nothing); the lenient
counterpart is :func:`flowmem.normalize`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Final

from .errors import InvalidMessage, InvalidValue, MessageTypeError
from .ids import result_id

__all__ = [
    "HEALED_CONTENT",
    "MAX_INT_BITS",
    "MAX_JSON_DEPTH",
    "ROLES",
    "Message",
    "canonical_message",
    "canonical_messages",
    "coerce_content",
    "dialect_mistake",
    "healed_placeholder",
    "json_copy",
]

Message = dict[str, Any]
"""A message dict. Stored messages are always in the canonical shape."""

ROLES: Final = frozenset({"system", "user", "assistant", "tool"})
HEALED_CONTENT: Final = "Tool call was interrupted; no result."
MAX_JSON_DEPTH: Final = 100
"""Containers nested deeper than this are refused, the same way on every backend."""

MAX_INT_BITS: Final = 4096
"""Integers wider than this are refused: JSON text of them is impractical (and
Python refuses to print ints over 4300 digits by default)."""

_TOP_LEVEL: Final = ("role", "content", "metadata")


class _NotJSON(Exception):
    """Raised deep inside a value; each container on the way out adds its step."""

    def __init__(self, reason: str, *, wrong_type: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.wrong_type = wrong_type
        self.steps: list[str] = []

    @property
    def path(self) -> str:
        return "".join(reversed(self.steps)).lstrip(".")


def _copy(value: Any, depth: int) -> Any:
    kind = type(value)
    if kind is str or value is None or kind is bool:
        return value
    if kind is dict and depth < MAX_JSON_DEPTH:  # the common cases, without ABC checks
        return _copy_mapping(value, depth)
    if kind is list and depth < MAX_JSON_DEPTH:
        return _copy_list(value, depth)
    return _copy_other(value, depth)


def _copy_mapping(value: Mapping[Any, Any], depth: int) -> dict[str, Any]:
    copied: dict[str, Any] = {}
    for key, item in value.items():
        if type(key) is not str:
            if not isinstance(key, str):
                raise _NotJSON(f"object key {key!r} is not a string")
            key = str.__str__(key)
        kind = type(item)
        if kind is str or item is None or kind is bool:  # a leaf is its own copy: no call
            copied[key] = item
            continue
        try:  # a nested dict (a tool call's function) without the _copy dispatch
            if kind is dict and depth + 1 < MAX_JSON_DEPTH:
                copied[key] = _copy_mapping(item, depth + 1)
            else:
                copied[key] = _copy(item, depth + 1)
        except _NotJSON as exc:
            exc.steps.append(f".{key}")
            raise
    return copied


def _copy_other(value: Any, depth: int) -> Any:
    # Subclasses (IntEnum, str subclasses) become the plain type, as they read back
    # from every database.
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        if value.bit_length() > MAX_INT_BITS:
            raise _NotJSON(f"integer of {value.bit_length()} bits is too large "
                           f"(at most {MAX_INT_BITS})", wrong_type=False)
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _NotJSON(f"{value!r} is not a JSON number", wrong_type=False)
        return float(value)
    if depth >= MAX_JSON_DEPTH:
        raise _NotJSON(f"nested deeper than {MAX_JSON_DEPTH} levels", wrong_type=False)
    if isinstance(value, Mapping):
        return _copy_mapping(value, depth)
    if isinstance(value, list | tuple):
        return _copy_list(value, depth)
    raise _NotJSON(f"{type(value).__name__} is not JSON-serializable")


def _copy_list(value: list[Any] | tuple[Any, ...], depth: int) -> list[Any]:
    copied = []
    for index, item in enumerate(value):
        kind = type(item)
        if kind is str or item is None or kind is bool:  # a leaf is its own copy: no call
            copied.append(item)
            continue
        try:  # a dict in a list (a tool call) without the _copy dispatch
            if kind is dict and depth + 1 < MAX_JSON_DEPTH:
                copied.append(_copy_mapping(item, depth + 1))
            else:
                copied.append(_copy(item, depth + 1))
        except _NotJSON as exc:
            exc.steps.append(f"[{index}]")
            raise
    return copied


def _joined(path: str) -> str:
    """``path`` appended to a field name: ``.key`` or ``[1]``, never ``.[1]``."""
    return path if not path or path.startswith("[") else f".{path}"


def json_copy(value: Any, *, what: str = "value") -> Any:
    """A deep copy of a JSON value, or :class:`InvalidValue` naming what is wrong.

    JSON here means: ``None``, ``str`` (any code points, ``\\u0000`` and lone
    surrogates included), ``bool``, ``int`` of at most :data:`MAX_INT_BITS`
    bits, finite ``float``, lists (tuples become lists) and string-keyed
    mappings, nested at most :data:`MAX_JSON_DEPTH` levels. Subclasses of
    ``str``/``int``/``float`` become the plain type.
    """
    try:
        return _copy(value, 0)
    except _NotJSON as exc:
        where = what + _joined(exc.path)
        raise InvalidValue(f"{where}: {exc.reason}") from None


def _field_copy(value: Any, field: str, index: int | None, where: str) -> Any:
    try:
        return _copy(value, 0)
    except _NotJSON as exc:
        name = field + _joined(exc.path)
        error = MessageTypeError if exc.wrong_type else InvalidMessage
        raise error(exc.reason, index=index, field=name, where=where) from None


def canonical_message(message: Any, *, index: int | None = None,
                      where: str = "incoming") -> Message:
    """Validate one message and return it in the canonical shape (a new dict).

    Raises :class:`~flowmem.errors.InvalidMessage` (or its ``TypeError``
    subclass) naming ``where[index].field`` when the message is not a
    mapping, its role is missing or unknown, or a field is not JSON.
    """
    return _canonical(message, index, where)


def _canonical(message: Any, index: int | None, where: str) -> Message:
    """:func:`canonical_message`, positional (the per-append call)."""
    if type(message) is not dict and not isinstance(message, Mapping):
        raise MessageTypeError(f"expected a message mapping, got {type(message).__name__}",
                               index=index, where=where)
    role = message.get("role")
    if not isinstance(role, str) or role not in ROLES:
        hint = _dialect_hint(message)
        raise InvalidMessage(hint or f"role must be one of {sorted(ROLES)}, got {role!r}",
                             index=index, field="role" if hint is None or role else "type",
                             where=where)
    content = message.get("content")
    if isinstance(content, list):
        _refuse_anthropic_blocks(content, index, where)
    given_metadata = message.get("metadata")
    if given_metadata is not None and type(given_metadata) is not dict \
            and not isinstance(given_metadata, Mapping):
        raise MessageTypeError(f"metadata must be a mapping, got {type(given_metadata).__name__}",
                               index=index, field="metadata", where=where)
    metadata: dict[str, Any] = (_field_copy(given_metadata, "metadata", index, where)
                                if given_metadata else {})
    for key, value in message.items():
        if key in _TOP_LEVEL or value is None:
            continue
        if type(key) is not str and not isinstance(key, str):
            raise MessageTypeError(f"field name {key!r} is not a string", index=index, where=where)
        # a plain string is its own copy: the common field, without the walk
        metadata[key] = value if type(value) is str else _field_copy(value, key, index, where)
    if "tool_calls" in metadata:
        _check_pairing_fields(metadata, index, where)
    if role == "tool":
        answered = result_id(message)
        if answered is not None:
            metadata["tool_call_id"] = answered
    if content is not None and type(content) is not str:
        content = _field_copy(content, "content", index, where)
    return {"role": role, "content": content, "metadata": metadata}


_ANTHROPIC_PAIRING: Final = frozenset({"tool_use", "tool_result"})
_CONVERTERS: Final = {
    "openai": "flowmem.formats.from_openai_chat (format='openai')",
    "responses": "flowmem.formats.from_responses (format='responses')",
    "anthropic": "flowmem.formats.from_anthropic (format='anthropic')",
}


def _dialect_hint(message: Mapping[Any, Any]) -> str | None:
    """Why a role-less or foreign-role message is another dialect, naming its converter."""
    role, kind = message.get("role"), message.get("type")
    if role is None and isinstance(kind, str):
        return (f"this is an OpenAI Responses item (type {kind!r}), not a message: "
                f"convert it with {_CONVERTERS['responses']}")
    if role in ("developer", "function"):
        return (f"role {role!r} is OpenAI Chat's: convert the messages with "
                f"{_CONVERTERS['openai']}")
    return None


def dialect_mistake(messages: Any) -> str | None:
    """Why ``messages`` look like another dialect than canonical (naming the converter),
    or ``None``: the one check :func:`canonical_messages` and the HTTP doors share."""
    for index, message in enumerate(messages if isinstance(messages, list) else ()):
        if not isinstance(message, Mapping):
            continue
        hint = _dialect_hint(message)
        content = message.get("content")
        if hint is None and isinstance(content, list) and any(
                isinstance(b, Mapping) and b.get("type") in _ANTHROPIC_PAIRING for b in content):
            hint = (f"Anthropic tool_use/tool_result blocks: convert the messages with "
                    f"{_CONVERTERS['anthropic']} so the tool pairing is kept")
        if hint is not None:
            return f"messages[{index}]: {hint}"
    return None


def _refuse_anthropic_blocks(content: list[Any], index: int | None, where: str) -> None:
    """Anthropic ``tool_use``/``tool_result`` blocks carry pairing the buffer must see."""
    for i, block in enumerate(content):
        if isinstance(block, Mapping) and block.get("type") in _ANTHROPIC_PAIRING:
            raise InvalidMessage(f"an Anthropic {block['type']} block: convert the messages "
                                 f"with {_CONVERTERS['anthropic']} so the tool pairing is kept",
                                 index=index, field=f"content[{i}]", where=where)


def _check_pairing_fields(metadata: dict[str, Any], index: int | None, where: str) -> None:
    calls = metadata.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise MessageTypeError("tool_calls must be a list", index=index,
                                   field="tool_calls", where=where)
        for i, entry in enumerate(calls):
            if not isinstance(entry, dict):
                raise MessageTypeError("a tool call must be a mapping", index=index,
                                       field=f"tool_calls[{i}]", where=where)


def canonical_messages(messages: Any, *, where: str = "incoming") -> list[Message]:
    """Validate one message or a list of them; all or nothing."""
    if type(messages) is dict or isinstance(messages, Mapping):
        return [_canonical(messages, None, where)]
    if not isinstance(messages, list | tuple):
        raise MessageTypeError(f"expected a message or a list of messages, "
                               f"got {type(messages).__name__}", where=where)
    return [_canonical(item, i, where) for i, item in enumerate(messages)]


def healed_placeholder(call_id: str) -> Message:
    """The synthetic result the buffer writes for a call that never got one (MEM-3)."""
    return {"role": "tool", "content": HEALED_CONTENT,
            "metadata": {"tool_call_id": call_id, "healed": True}}


def coerce_content(content: Any) -> str:
    """Content as provider-sendable text (MEM-5 step 1, MEM-16).

    ``None`` becomes ``""``, a bool ``"true"``/``"false"``, a number its
    decimal text, a string itself; anything else is serialized to JSON text,
    and content that cannot be serialized becomes ``""``.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, bool):
        return "true" if content else "false"
    if isinstance(content, int | float):
        return repr(content)
    try:
        return json.dumps(content, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return ""
