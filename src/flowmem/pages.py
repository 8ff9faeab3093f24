"""Pages of a conversation whose messages may arrive as their stored JSON text.

The SQL and Redis stores hold each message as JSON text. A page they read
carries those texts (``encoded``) with ``messages`` left :data:`UNPARSED`;
:func:`parse_on_read` makes ``messages`` parse them when first read. A
server that passes a page on (the echo of an HTTP turn) never parses it;
everyone else sees a plain list, parsed once. The classes stay dataclasses
(``fields``, ``asdict``, ``replace``, equality and ``repr`` read ``messages``
and so see it parsed). Pure: no I/O.
"""

from __future__ import annotations

import json
from typing import Any, Final, TypeVar

from .messages import Message

__all__ = ["UNPARSED", "parse_on_read", "unparsed"]

C = TypeVar("C", bound=type)

UNPARSED: Final[list[Any]] = []
"""Given as ``messages`` (by identity) with ``encoded``: parse ``encoded`` on first read.
Never handed out: the first read replaces it."""


def parse_on_read(cls: C) -> C:
    """Make the slotted dataclass ``cls``'s ``messages`` parse ``encoded`` on first read.

    Apply it after the dataclass (and :func:`~flowmem._frozen.quick_init`, whose
    ``__init__`` keeps storing into the slot itself).
    """
    slot = cls.__dict__["messages"]

    def messages(self: Any) -> list[Message]:
        value: list[Message] = slot.__get__(self, cls)
        if value is UNPARSED:
            texts = self.encoded or []
            value = json.loads("[" + ",".join(texts) + "]") if texts else []
            slot.__set__(self, value)
        return value

    setattr(cls, "_messages_slot", slot)  # noqa: B010 - a slot descriptor, kept for unparsed()
    setattr(cls, "messages", property(messages, slot.__set__,  # noqa: B010
                                      doc="The messages, oldest first."))
    return cls


def unparsed(page: Any) -> list[Message]:
    """``page.messages`` as stored: :data:`UNPARSED` if not read yet (to pass it on as is)."""
    value: list[Message] = type(page)._messages_slot.__get__(page, type(page))
    return value
