"""MEM-5's repair, the pass :func:`~flowmem.normalize.normalize` and
:func:`~flowmem.normalize.repair_pairing` share: coerce each entry (step 1), then
put ``system`` first, repair the tool pairing and strip a leading ``tool``
(steps 2-4), counting every drop where it is made. O(n), one pass in order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..ids import call_entries, call_id, result_id
from ..messages import HEALED_CONTENT, ROLES, Message, coerce_content

__all__ = ["Entry", "Tally", "as_list", "coerce", "structural"]


class Tally:
    """The drop count, incremented by the code that removes, when it removes (MEM-5)."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def drop(self) -> None:
        self.count += 1


@dataclass
class Entry:
    """One coerced message: role, text content, raw call entries, answered id."""

    role: str
    content: str
    calls: list[Any] = field(default_factory=list)
    result: str | None = None
    source: Message | None = None
    """The canonical message this entry stands for
    (:func:`~flowmem.normalize.repair_pairing` only)."""
    blank: bool = False
    """Whether an assistant turn has nothing to send besides its calls."""


@dataclass
class Turn:
    """An assistant turn being repaired, with the block of results it owns."""

    content: str
    source: Message | None = None
    calls: list[Any] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    results: dict[str, Entry] = field(default_factory=dict)


def as_list(messages: Any) -> list[Any]:
    """The entries of ``messages``: ``None`` is empty, a lone mapping is one message."""
    if messages is None:
        return []
    if isinstance(messages, Mapping):
        return [messages]
    if isinstance(messages, Iterable) and not isinstance(messages, str | bytes | bytearray):
        return list(messages)
    return [messages]


def _coerce_one(item: Any) -> Entry | None:
    """MEM-5 step 1 for one entry; ``None`` when it has to be dropped."""
    if not isinstance(item, Mapping):
        return None
    role = item.get("role")
    if not isinstance(role, str) or role not in ROLES:
        return None
    content = coerce_content(item.get("content"))
    if role == "system":
        return Entry(role, content)
    return Entry(role, content, calls=call_entries(item), result=result_id(item),
                  blank=content == "")


def coerce(items: list[Any], tally: Tally) -> list[Entry]:
    """MEM-5 step 1: coerce every entry, dropping non-mappings and role-less entries."""
    entries: list[Entry] = []
    for item in items:
        entry = _coerce_one(item)
        if entry is None:
            tally.drop()
        else:
            entries.append(entry)
    return entries


class _Repair:
    """MEM-5 step 3, one pass in order over the non-system messages, O(n).

    ``per_turn`` (the call-id policy, :mod:`flowmem.call_ids`): an id a later turn
    declares again is a new declaration, which then owns the id's results; a turn
    declaring an id twice still keeps the first."""

    def __init__(self, tally: Tally, per_turn: bool = False) -> None:
        self._tally = tally
        self._per_turn = per_turn
        self._owners: dict[str, Turn] = {}
        self._items: list[Entry | Turn] = []

    def run(self, entries: list[Entry]) -> list[Entry]:
        for entry in entries:
            if entry.role == "assistant":
                self._assistant(entry)
            elif entry.role == "tool":
                self._tool(entry)
            else:
                self._items.append(entry)
        return self._emit()

    def _assistant(self, entry: Entry) -> None:
        """Keep the first usable declaration of each id; drop an emptied turn."""
        turn = Turn(entry.content, entry.source)
        for call in entry.calls:
            found = call_id(call)
            if found is None or (found in self._owners and (
                    not self._per_turn or self._owners[found] is turn)):
                self._tally.drop()
                continue
            self._owners[found] = turn
            turn.calls.append(call)
            turn.ids.append(found)
        if not turn.calls and entry.blank:
            self._tally.drop()
            return
        self._items.append(turn)

    def _tool(self, entry: Entry) -> None:
        """Attach a result to the turn owning its id; drop orphans and duplicates."""
        found = entry.result
        owner = None if found is None else self._owners.get(found)
        if found is None or owner is None or found in owner.results:
            self._tally.drop()
            return
        owner.results[found] = entry

    def _emit(self) -> list[Entry]:
        out: list[Entry] = []
        for item in self._items:
            if isinstance(item, Entry):
                out.append(item)
                continue
            out.append(Entry("assistant", item.content, calls=item.calls, source=item.source))
            out.extend(item.results.values())
            out.extend(Entry("tool", HEALED_CONTENT, result=found)
                       for found in item.ids if found not in item.results)
        return out


def _repair(entries: list[Entry], tally: Tally, per_turn: bool) -> list[Entry]:
    return _Repair(tally, per_turn).run(entries)


def structural(entries: list[Entry], tally: Tally, per_turn: bool = False) -> list[Entry]:
    """MEM-5 steps 2-4 on coerced entries: system first, pairing repaired, no leading tool."""
    system = [entry for entry in entries if entry.role == "system"]
    others = _repair([entry for entry in entries if entry.role != "system"], tally, per_turn)
    while others and others[0].role == "tool":
        tally.drop()
        others = _repair(others[1:], tally, per_turn)
    return system + others
