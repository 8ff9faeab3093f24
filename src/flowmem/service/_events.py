"""What changed in a conversation's tail: the pure part of the session event stream.

A :class:`Tail` remembers the newest entries of a conversation (position ->
a digest of the message) and the conversation's length; :meth:`Tail.change`
compares a fresh page of the newest entries with it and says what happened
since: entries added, placeholders inserted (MEM-3), placeholders replaced
by their real result (MEM-10), other replacements (an admin edit, MEM-15),
entries gone (a reset, a delete, an eviction), and the delta of the appends
in between (MEM-14: ``appended`` counts the new entries at appended slots).

How a replacement is told from an append: the append planner gives an
appended entry a multiple of :data:`flowmem.plan.SLOT` and a placeholder
inserted after the entry at ``p`` the position ``p + 1`` (``p + 2``…), so a
``tool`` result at a position that is not a multiple of ``SLOT`` and not
marked ``healed`` is a real result that replaced its placeholder (a late
result, MEM-10). The page of the UI uses the same test.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ..plan import SLOT

__all__ = ["TAIL", "Change", "Tail", "is_late_result", "sse"]

TAIL: Final = 50
"""How many of the newest entries an event stream watches."""


def is_late_result(position: int, message: dict[str, Any]) -> bool:
    """Whether the entry is a real result that replaced a healed placeholder (MEM-10)."""
    metadata = message.get("metadata") or {}
    return (message.get("role") == "tool" and position % SLOT != 0
            and metadata.get("healed") is not True)


def _is_healed(message: dict[str, Any]) -> bool:
    return (message.get("metadata") or {}).get("healed") is True


def _digest(message: dict[str, Any]) -> str:
    text = json.dumps(message, sort_keys=True, ensure_ascii=True, default=str)
    return hashlib.blake2b(text.encode("ascii"), digest_size=12).hexdigest()


@dataclass(frozen=True, slots=True)
class Change:
    """What a fresh page says happened since the previous one."""

    count: int
    appended: int = 0
    healed: tuple[int, ...] = ()
    replaced: tuple[int, ...] = ()
    edited: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()
    messages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """Nothing to tell."""
        return not (self.messages or self.removed)

    def to_json(self) -> dict[str, Any]:
        """The ``change`` event's data."""
        return {"count": self.count, "appended": self.appended,
                "appended_any": self.appended > 0, "healed": list(self.healed),
                "replaced": list(self.replaced), "edited": list(self.edited),
                "removed": list(self.removed), "messages": self.messages}


class Tail:
    """The newest entries last seen, and the conversation's length."""

    def __init__(self) -> None:
        self.count = 0
        self.seen: dict[int, str] = {}
        self.healed: set[int] = set()

    def change(self, positions: Sequence[int], messages: Sequence[dict[str, Any]],
               count: int) -> Change:
        """Compare the newest entries (oldest first) with what was seen; remember them."""
        fresh = {p: _digest(m) for p, m in zip(positions, messages, strict=True)}
        oldest = positions[0] if positions else None
        added: list[int] = []
        healed: list[int] = []
        replaced: list[int] = []
        edited: list[int] = []
        out: list[dict[str, Any]] = []
        for position, message in zip(positions, messages, strict=True):
            before = self.seen.get(position)
            if before == fresh[position]:
                continue
            if before is None:
                if self.seen and position < min(self.seen):
                    continue  # an older entry slid into the window: not a change
                if _is_healed(message):
                    healed.append(position)
                elif position % SLOT:  # a placeholder inserted and replaced since
                    replaced.append(position)
                else:
                    added.append(position)
            elif position in self.healed and not _is_healed(message):
                replaced.append(position)
            else:
                edited.append(position)
            out.append({"position": position, "message": message})
        removed = sorted(p for p in self.seen if p not in fresh
                         and (oldest is None or p >= oldest))
        appended = len(added)
        self.count = count
        self.seen = fresh
        self.healed = {p for p, m in zip(positions, messages, strict=True) if _is_healed(m)}
        return Change(count, appended, tuple(healed), tuple(replaced), tuple(edited),
                      tuple(removed), out)


def sse(event: str, data: Any) -> bytes:
    """One server-sent event (``data`` as one line of ASCII JSON)."""
    text = json.dumps(data, ensure_ascii=True, separators=(",", ":"))
    return f"event: {event}\ndata: {text}\n\n".encode("ascii")
