"""Normalization: any message list to a provider-sendable one (MEM-5).

:func:`normalize` is the lenient counterpart of the strict validation in
:mod:`flowmem.messages`: it never raises on bad messages, it repairs or drops
them and reports how many things it removed. Its output always satisfies the
**Sendable** invariant, which :func:`sendability_problems` and
:func:`is_sendable` check on any list, in the flat provider shape or in our
canonical shape (pairing fields inside ``metadata``).

Every id is read through :mod:`flowmem.ids` (MEM-11) and every content goes
through :func:`flowmem.messages.coerce_content`. The repair pass both public
functions run is ``_pairing``, the Sendable check ``_sendable``; every name is
imported from here.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..call_ids import CallIds, check_call_ids
from ..ids import call_entries, call_id, call_id_field, result_id
from ..messages import Message, coerce_content, healed_placeholder
from ._pairing import Entry, Tally, as_list, coerce, structural
from ._sendable import is_sendable, sendability_problems

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


def _flat(entry: Entry) -> Message:
    message: Message = {"role": entry.role, "content": entry.content}
    if entry.calls:
        message["tool_calls"] = [_copy_call(call) for call in entry.calls]
    if entry.role == "tool" and entry.result is not None:
        message["tool_call_id"] = entry.result
    return message


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
    tally = Tally()
    entries = structural(coerce(as_list(messages), tally), tally, per_turn)
    return NormalizeResult([_flat(entry) for entry in entries], tally.count)


def _source_entry(message: Message, blank: Callable[[Message], bool]) -> Entry:
    role = message["role"]
    if role == "system":
        return Entry(role, "", source=message)
    if role == "tool":
        return Entry(role, "", result=result_id(message), source=message)
    return Entry(role, "", calls=call_entries(message), source=message,
                  blank=role == "assistant" and blank(message))


def _repaired(entry: Entry) -> Message:
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
    tally = Tally()
    entries = structural([_source_entry(m, blank) for m in messages], tally, per_turn)
    return [_repaired(entry) for entry in entries], tally.count
