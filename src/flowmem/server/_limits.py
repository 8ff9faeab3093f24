"""The limits of one app, and the door-level checks that run after the body gate.

The body gate itself (size, depth, shape, numbers: STORE-1) is
:mod:`.gate`; what is here are each door's own refusals: messages per
append, characters of content, bytes of a whole message (content, metadata
and every other field) and of a value, and the size of a read answered whole.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from ._responses import ApiError

__all__ = ["Limits", "check_messages", "check_value", "json_bytes"]

MIB: Final = 1_048_576


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits one app enforces (all documented in ``/openapi.json``).

    ``max_body_bytes`` and ``max_json_depth`` are STORE-1's numbers (8 MiB;
    63 levels accepted, 64 refused); lower them only in tests. The schema
    caps ``messages`` at 100 per append, so ``max_messages_per_append`` can
    lower that limit, not raise it. ``max_read_bytes`` bounds a value read
    whole by ``/v1/memory/read``: a longer conversation is paged with
    ``/v1/memory/history``. ``max_budget_tokens`` bounds the ``max_tokens`` of a
    budgeted history read (the schema caps it at the default; it can be lowered).
    """

    max_body_bytes: int = 8 * MIB
    max_json_depth: int = 63
    max_messages_per_append: int = 100
    max_content_chars: int = 65_536
    max_message_bytes: int = 393_216
    max_value_bytes: int = 524_288
    max_read_bytes: int = MIB
    max_budget_tokens: int = 10_000_000


def json_bytes(value: Any) -> int:
    """The size of ``value`` as stored: its JSON text in UTF-8 (lone surrogates escaped)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":"))
               .encode("utf-8", "surrogatepass"))


def _content_chars(content: Any) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content)
    return len(json.dumps(content, ensure_ascii=False))


def check_messages(messages: Sequence[dict[str, Any]], limits: Limits) -> None:
    """Messages per append, characters of content, bytes of each whole message (400)."""
    if len(messages) > limits.max_messages_per_append:
        raise ApiError("too_many_messages",
                       f"at most {limits.max_messages_per_append} messages per append, "
                       f"got {len(messages)}")
    for index, message in enumerate(messages):
        chars = _content_chars(message.get("content"))
        if chars > limits.max_content_chars:
            raise ApiError("message_too_large",
                           f"messages[{index}].content: {chars} characters, more than the "
                           f"limit of {limits.max_content_chars}")
        size = json_bytes(message)
        if size > limits.max_message_bytes:
            raise ApiError("message_too_large",
                           f"messages[{index}]: {size} bytes with its metadata and every "
                           f"other field, more than the limit of {limits.max_message_bytes}")


def check_value(value: Any, limits: Limits) -> None:
    """A memory value over the byte limit (400)."""
    size = json_bytes(value)
    if size > limits.max_value_bytes:
        raise ApiError("value_too_large",
                       f"value: {size} bytes, more than the limit of {limits.max_value_bytes}")
