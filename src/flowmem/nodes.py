"""Nodes over message lists: assembly (MEM-4) and text to message (MEM-16).

Both are pure functions; the workflow runtime wires them as nodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .ids import nonblank_id
from .messages import ROLES, Message, coerce_content

__all__ = ["assemble", "text_to_message"]


def _contribution(value: Any) -> list[Any]:
    """What one input adds (MEM-4): a list its items, a message itself, nothing for None."""
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return list(value)
    return [value]


def _pairs(inputs: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> Iterable[tuple[Any, Any]]:
    """The (port, value) pairs of ``inputs``, in declared (insertion) order."""
    if isinstance(inputs, Mapping):
        return inputs.items()
    pairs: list[tuple[Any, Any]] = []
    for pair in inputs:
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise TypeError(f"expected a (port_name, value) pair, got {pair!r}")
        pairs.append((pair[0], pair[1]))
    return pairs


def assemble(inputs: Mapping[str, Any] | Iterable[tuple[str, Any]] | None) -> list[Any]:
    """Flatten declared message inputs into one list, in DECLARED order (MEM-4).

    ``inputs`` is a sequence of ``(port_name, value)`` pairs in declared order,
    or a mapping in insertion order; it is never sorted by name. A list or
    tuple value contributes its items, a single message (any other value, a
    mapping included) contributes itself, and ``None`` or an empty list
    contributes nothing: there is no null placeholder. Items are not copied
    or validated here; :func:`flowmem.normalize.normalize` repairs the result.
    Raises :class:`TypeError` when a sequence item is not a pair.
    """
    if inputs is None:
        return []
    assembled: list[Any] = []
    for _port, value in _pairs(inputs):
        assembled.extend(_contribution(value))
    return assembled


def text_to_message(text: Any, role: Any = None,
                    tool_call_id: Any = None) -> tuple[list[Message], Message]:
    """One message from text, as a one-element list and as the row alone (MEM-16).

    Content is coerced as in MEM-5 (:func:`~flowmem.messages.coerce_content`).
    A role outside ``user|assistant|system|tool`` (absent included) becomes
    ``user``. ``tool_call_id`` is kept only on a ``tool`` row, trimmed, and
    omitted when blank (:func:`~flowmem.ids.nonblank_id`) and only then: ``"0"``
    is kept, as the spec's word is "blank". A bool or a non-scalar is no id.
    Empty content (``""`` after coercion; whitespace is content) gives
    ``([], {})``, a ``tool`` row too. The row in the list and the row alone
    are equal but distinct dicts.
    """
    content = coerce_content(text)
    if content == "":
        return [], {}
    kind = role if isinstance(role, str) and role in ROLES else "user"
    message: Message = {"role": kind, "content": content}
    if kind == "tool":
        found = nonblank_id(tool_call_id)
        if found is not None:
            message["tool_call_id"] = found
    return [message], dict(message)
