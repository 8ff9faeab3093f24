"""Normalization: any message list to a provider-sendable one (MEM-5).

:func:`normalize` is the lenient counterpart of the strict validation in
:mod:`flowmem.messages`: it never raises on bad messages, it repairs or drops
them and reports how many things it removed. Its output always satisfies the
**Sendable** invariant, which :func:`sendability_problems` and
:func:`is_sendable` check on any list, in the flat provider shape or in our
canonical shape (pairing fields inside ``metadata``).

Every id is read through :mod:`flowmem.ids` (MEM-11) and every content goes
through :func:`flowmem.messages.coerce_content`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .call_ids import CallIds, check_call_ids
from .ids import call_entries, call_id, call_id_field, result_id
from .messages import HEALED_CONTENT, ROLES, Message, coerce_content, healed_placeholder

__all__ = [
    "NormalizeResult",
    "is_sendable",
    "normalize",
    "repair_pairing",
    "sendability_problems",
]


@dataclass(frozen=True)
class NormalizeResult:
    """What :func:`normalize` returns (MEM-5).

    ``messages`` is the sendable list in the flat shape
    ``{"role", "content", "tool_calls"?, "tool_call_id"?}``; ``dropped`` is the
    number of messages and call declarations removed.
    """

    messages: list[Message]
    dropped: int


# --------------------------------------------------------------------------- internals


class _Tally:
    """The drop count, incremented by the code that removes, when it removes (MEM-5)."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def drop(self) -> None:
        self.count += 1


@dataclass
class _Entry:
    """One coerced message: role, text content, raw call entries, answered id."""

    role: str
    content: str
    calls: list[Any] = field(default_factory=list)
    result: str | None = None
    source: Message | None = None
    """The canonical message this entry stands for (:func:`repair_pairing` only)."""
    blank: bool = False
    """Whether an assistant turn has nothing to send besides its calls."""


@dataclass
class _Turn:
    """An assistant turn being repaired, with the block of results it owns."""

    content: str
    source: Message | None = None
    calls: list[Any] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    results: dict[str, _Entry] = field(default_factory=dict)


def _as_list(messages: Any) -> list[Any]:
    """The entries of ``messages``: ``None`` is empty, a lone mapping is one message."""
    if messages is None:
        return []
    if isinstance(messages, Mapping):
        return [messages]
    if isinstance(messages, Iterable) and not isinstance(messages, str | bytes | bytearray):
        return list(messages)
    return [messages]


def _coerce_one(item: Any) -> _Entry | None:
    """MEM-5 step 1 for one entry; ``None`` when it has to be dropped."""
    if not isinstance(item, Mapping):
        return None
    role = item.get("role")
    if not isinstance(role, str) or role not in ROLES:
        return None
    content = coerce_content(item.get("content"))
    if role == "system":
        return _Entry(role, content)
    return _Entry(role, content, calls=call_entries(item), result=result_id(item),
                  blank=content == "")


def _coerce(items: list[Any], tally: _Tally) -> list[_Entry]:
    """MEM-5 step 1: coerce every entry, dropping non-mappings and role-less entries."""
    entries: list[_Entry] = []
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

    def __init__(self, tally: _Tally, per_turn: bool = False) -> None:
        self._tally = tally
        self._per_turn = per_turn
        self._owners: dict[str, _Turn] = {}
        self._items: list[_Entry | _Turn] = []

    def run(self, entries: list[_Entry]) -> list[_Entry]:
        for entry in entries:
            if entry.role == "assistant":
                self._assistant(entry)
            elif entry.role == "tool":
                self._tool(entry)
            else:
                self._items.append(entry)
        return self._emit()

    def _assistant(self, entry: _Entry) -> None:
        """Keep the first usable declaration of each id; drop an emptied turn."""
        turn = _Turn(entry.content, entry.source)
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

    def _tool(self, entry: _Entry) -> None:
        """Attach a result to the turn owning its id; drop orphans and duplicates."""
        found = entry.result
        owner = None if found is None else self._owners.get(found)
        if found is None or owner is None or found in owner.results:
            self._tally.drop()
            return
        owner.results[found] = entry

    def _emit(self) -> list[_Entry]:
        out: list[_Entry] = []
        for item in self._items:
            if isinstance(item, _Entry):
                out.append(item)
                continue
            out.append(_Entry("assistant", item.content, calls=item.calls, source=item.source))
            out.extend(item.results.values())
            out.extend(_Entry("tool", HEALED_CONTENT, result=found)
                       for found in item.ids if found not in item.results)
        return out


def _repair(entries: list[_Entry], tally: _Tally, per_turn: bool) -> list[_Entry]:
    return _Repair(tally, per_turn).run(entries)


def _structural(entries: list[_Entry], tally: _Tally, per_turn: bool = False) -> list[_Entry]:
    """MEM-5 steps 2-4 on coerced entries: system first, pairing repaired, no leading tool."""
    system = [entry for entry in entries if entry.role == "system"]
    others = _repair([entry for entry in entries if entry.role != "system"], tally, per_turn)
    while others and others[0].role == "tool":
        tally.drop()
        others = _repair(others[1:], tally, per_turn)
    return system + others


def _copy_call(call: Mapping[str, Any]) -> dict[str, Any]:
    """A call entry copied (provider fields intact, never shared with the input).

    The id is written back as read (trimmed, an int cast) under the spelling
    it was read from, so the call and its result carry the same string.
    """
    copied: dict[str, Any] = {}
    for key, value in call.items():
        try:
            copied[key] = copy.deepcopy(value)
        except Exception:
            copied[key] = value
    spelling = call_id_field(call)
    if spelling is not None:
        copied[spelling] = call_id(call)
    return copied


def _flat(entry: _Entry) -> Message:
    message: Message = {"role": entry.role, "content": entry.content}
    if entry.calls:
        message["tool_calls"] = [_copy_call(call) for call in entry.calls]
    if entry.role == "tool" and entry.result is not None:
        message["tool_call_id"] = entry.result
    return message


# --------------------------------------------------------------------------- public


def normalize(messages: Any, *, call_ids: CallIds = "strict") -> NormalizeResult:
    """Turn any message list into a provider-sendable one (MEM-5).

    Steps: (1) coerce each entry to the flat shape, dropping non-mappings and
    entries without one of the four roles; (2) move ``system`` messages to the
    front, both groups keeping their order; (3) repair tool pairing — unusable
    or repeated call declarations are removed, orphan and duplicate results
    dropped, results moved into the block of the turn that first declared
    them, unanswered calls given a synthetic interrupted result, and an
    assistant turn with no calls and no content dropped; (4) strip any
    ``tool`` message leading the non-system part, then repair again.

    ``dropped`` counts every message and every call declaration removed;
    moving or synthesizing a result counts nothing. The input is never
    mutated. ``None`` is an empty list and a lone mapping a one-message list.
    The result is sendable (:func:`is_sendable`) and normalizing it again
    changes nothing.

    ``call_ids`` is the call-id policy the list was written under
    (:mod:`flowmem.call_ids`). ``"strict"`` (the default) is MEM-5 as the spec
    states it: an id declared a second time is removed from the later turn.
    ``"per_turn"`` (for a per-turn memory's history, which gives the caller's ids
    back) takes an id a later turn declares again as a new declaration: each
    declaration owns the results after it, up to the id's next declaration. The
    result is then sendable under the same policy.
    """
    per_turn = check_call_ids(call_ids) == "per_turn"
    tally = _Tally()
    entries = _structural(_coerce(_as_list(messages), tally), tally, per_turn)
    return NormalizeResult([_flat(entry) for entry in entries], tally.count)


def _source_entry(message: Message, blank: Callable[[Message], bool]) -> _Entry:
    role = message["role"]
    if role == "system":
        return _Entry(role, "", source=message)
    if role == "tool":
        return _Entry(role, "", result=result_id(message), source=message)
    return _Entry(role, "", calls=call_entries(message), source=message,
                  blank=role == "assistant" and blank(message))


def _repaired(entry: _Entry) -> Message:
    source = entry.source
    if source is None:  # a synthetic result for a dangling call
        assert entry.result is not None
        return healed_placeholder(entry.result)
    if entry.role != "assistant" or len(entry.calls) == len(call_entries(source)):
        return source
    metadata = {k: v for k, v in source["metadata"].items() if k != "tool_calls"}
    if entry.calls:
        metadata["tool_calls"] = entry.calls
    return {**source, "metadata": metadata}


def _blank_text(message: Message) -> bool:
    return coerce_content(message.get("content")) == ""


def repair_pairing(messages: Sequence[Message], *,
                   blank: Callable[[Message], bool] = _blank_text,
                   call_ids: CallIds = "strict") -> tuple[list[Message], int]:
    """The structural repairs of :func:`normalize` on canonical messages, payloads kept.

    Steps 2-4 of MEM-5 exactly as :func:`normalize` runs them (system first,
    orphan and duplicate results dropped, displaced results moved, dangling
    calls answered with :func:`~flowmem.messages.healed_placeholder`, repeated
    declarations removed, no leading ``tool``), but the messages keep their
    content and metadata untouched (no step 1 coercion), so a provider
    converter (:mod:`flowmem.formats`) can render them. ``blank(message)``
    says whether an assistant turn left with no calls has nothing to send
    (such a turn is dropped). Returns the repaired list (messages shared with
    the input unless changed; never mutated) and the drop count. ``call_ids``: as
    :func:`normalize`'s.
    """
    per_turn = check_call_ids(call_ids) == "per_turn"
    tally = _Tally()
    entries = _structural([_source_entry(m, blank) for m in messages], tally, per_turn)
    return [_repaired(entry) for entry in entries], tally.count


class _Checker:
    """Walks a list once and collects every breach of the Sendable invariant
    (``per_turn``: an id may be declared again by a later turn, :func:`normalize`)."""

    def __init__(self, per_turn: bool = False) -> None:
        self._per_turn = per_turn
        self.problems: list[str] = []
        self._seen_non_system = False
        self._declared: set[str] = set()
        self._answered: set[str] = set()
        self._block: dict[str, bool] | None = None
        self._block_at = -1

    def check(self, index: int, message: Any) -> None:
        if not isinstance(message, Mapping):
            self.problems.append(f"message {index}: not a mapping ({type(message).__name__})")
            self.close_block()
            return
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            self.problems.append(f"message {index}: role {role!r} is not one of {sorted(ROLES)}")
            self.close_block()
            return
        content = message.get("content")
        # OpenAI Chat takes ``content: null`` on an assistant turn that declares calls
        # (what flowmem.formats.to_openai_chat renders, and check_openai_chat accepts)
        if not isinstance(content, str) and not (content is None and role == "assistant"
                                                 and call_entries(message)):
            self.problems.append(f"message {index}: content is not a string")
        if role == "system":
            self._system(index)
        elif role == "tool":
            self._tool(index, message)
        else:
            self.close_block()
            self._seen_non_system = True
            if role == "assistant":
                self._assistant(index, message)

    def _system(self, index: int) -> None:
        if self._seen_non_system:
            self.problems.append(f"message {index}: system message after a non-system message")
        self.close_block()

    def _assistant(self, index: int, message: Mapping[str, Any]) -> None:
        block: dict[str, bool] = {}
        self._block, self._block_at = block, index
        for entry in call_entries(message):
            found = call_id(entry)
            if found is None:
                self.problems.append(f"message {index}: a declared call has no usable id")
            elif found in block or (found in self._declared and not self._per_turn):
                self.problems.append(f"message {index}: call id {found!r} is declared twice")
            else:
                self._answered.discard(found)  # per_turn: a new declaration of the id
                self._declared.add(found)
                block[found] = False

    def _tool(self, index: int, message: Mapping[str, Any]) -> None:
        if not self._seen_non_system:
            self.problems.append(f"message {index}: the first non-system message is a tool result")
            self._seen_non_system = True
        found = result_id(message)
        if found is None:
            self.problems.append(f"message {index}: tool result has no usable id")
        elif found in self._answered:
            self.problems.append(f"message {index}: call id {found!r} is answered twice")
        elif self._block is None or found not in self._block:
            self._answered.add(found)
            self.problems.append(f"message {index}: tool result for {found!r} is not in the "
                                 "block right after the assistant turn declaring it")
        else:
            self._answered.add(found)
            self._block[found] = True

    def close_block(self) -> None:
        if self._block is not None:
            for found, answered in self._block.items():
                if not answered:
                    self.problems.append(f"message {self._block_at}: call id {found!r} has no "
                                         "result in the block after it")
        self._block = None


def sendability_problems(messages: Any, *, call_ids: CallIds = "strict") -> list[str]:
    """Every breach of the Sendable invariant (MEM-5), as readable sentences.

    Sendable: every message is a mapping with one of the four roles and string
    content (``None`` is accepted on an assistant turn that declares calls, as
    OpenAI Chat accepts it); all ``system`` messages come first; the first non-system message
    is not ``tool``; every ``tool`` message sits in the contiguous block right
    after the ``assistant`` turn declaring its id; each declared id has exactly
    one result there; no id is declared twice or answered twice; no declared
    call or tool result has an unusable id. Ids are read through
    :mod:`flowmem.ids`, so the flat and the canonical shape are both accepted.
    An empty list means sendable.

    ``call_ids="per_turn"`` (:mod:`flowmem.call_ids`) accepts an id that a later
    turn declares again, each declaration answered once in its own block (a
    per-turn memory's history, with the caller's ids); ``"strict"`` (the default)
    reports it as declared twice.
    """
    checker = _Checker(check_call_ids(call_ids) == "per_turn")
    for index, message in enumerate(_as_list(messages)):
        checker.check(index, message)
    checker.close_block()
    return checker.problems


def is_sendable(messages: Any, *, call_ids: CallIds = "strict") -> bool:
    """Whether ``messages`` satisfies the Sendable invariant (MEM-5) under the call-id
    policy ``call_ids`` (:func:`sendability_problems`)."""
    return not sendability_problems(messages, call_ids=call_ids)
