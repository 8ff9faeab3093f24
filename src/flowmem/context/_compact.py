"""Compaction: everything older than a kept tail replaced by one summary (pure).

:func:`plan_compaction` decides, over a whole stored conversation, what a
compaction replaces: the messages after the leading system prompt (a previous
summary included, so summaries fold) up to a cut. The cut is a ``user``
message no later result reaches back across: no tool result at or after it
answers a call declared before it, so no result is separated from its call.
``keep_last=N`` keeps at least the newest ``N`` messages (the newest cut that
does); ``keep_last_tokens=N`` keeps the longest tail whose count is within
``N`` (as :mod:`._budget` counts, in the dialect given).

The summary is ONE ``system`` message, placed at the first replaced
position, whose ``metadata.compacted`` records what it replaced: ``first``
and ``last`` position, ``count``, the ``keep`` position (the first message
kept), the ``digest`` of the replaced entries, and the idempotency ``key``\\s
of this and the compactions it folded. It is written by ONE administrative
edit (MEM-15) that every store applies atomically, under the conversation's
serialization: :func:`compact_entries`, called by
:func:`flowmem.entries.edit_entries` for such a message, replaces the range
only if it still holds exactly the entries summarized (the digest) and
nothing stands between it and ``keep``; otherwise it raises
:class:`CompactionConflict` and nothing changes (the caller reads and
summarizes again).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..errors import InvalidInput
from ..ids import declared_call_ids, result_id
from ..messages import Message
from ..scopes import StorageKey
from ._budget import Fitter, _paired
from ._counters import TokenCounter

__all__ = ["COMPACTED", "CompactResult", "CompactionConflict", "CompactionPlan",
           "compact_entries", "is_summary", "plan_compaction", "summary_message"]

COMPACTED: Final = "compacted"
"""The metadata key of a compaction summary."""
_KEYS_KEPT: Final = 32


class CompactionConflict(InvalidInput):
    """The range a compaction summarized changed before it was replaced; nothing changed."""


@dataclass(frozen=True)
class CompactResult:
    """A compaction: ``replaced`` messages became one summary at ``position``.

    ``count`` is the conversation's length after it (``None`` when nothing was
    done). ``replayed``: an earlier compaction with the same idempotency key
    already did it (its figures). A refused scope (MEM-7) compacts nothing.
    Compaction is not an append: it appends nothing (MEM-14's figures are an
    append's) and ``count`` falls by ``replaced - 1``.
    """

    scope: str
    resolved_scope_id: str
    replaced: int = 0
    position: int | None = None
    count: int | None = None
    refused: bool = False
    replayed: bool = False
    summary: Message | None = None


@dataclass(frozen=True)
class CompactionPlan:
    """What a compaction will replace: ``messages`` (to summarize) at ``positions``."""

    where: StorageKey
    messages: list[Message]
    positions: list[int]
    keep: int
    digest: str
    total: int
    keys: list[str]


def is_summary(message: Message) -> bool:
    """Whether ``message`` is a compaction summary."""
    meta = message.get("metadata")
    return message["role"] == "system" and isinstance(meta, dict) and COMPACTED in meta


def digest(entries: Sequence[tuple[int, Message]]) -> str:
    """The fingerprint of stored entries (positions and messages)."""
    text = json.dumps([[pos, message] for pos, message in entries], sort_keys=True,
                      ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _cuts(body: Sequence[tuple[int, Message]]) -> list[int]:
    """Indexes ``i > 0`` of ``body`` where it may be cut: a user message that no tool result
    at or after it answers a call declared before it."""
    declared: dict[str, int] = {}
    reach = [0] * (len(body) + 1)  # reach[d]: the last index answering a call declared at d
    for index, (_, message) in enumerate(body):
        if message["role"] == "assistant":
            for call in declared_call_ids(message):
                declared.setdefault(call, index)
        elif message["role"] == "tool":
            found = result_id(message)
            if found in declared:
                turn = declared[found]
                reach[turn] = max(reach[turn], index)
    cuts, furthest = [], -1
    for index, (_, message) in enumerate(body):
        if index > 0 and message["role"] == "user" and furthest < index:
            cuts.append(index)
        furthest = max(furthest, reach[index] if index < len(body) else 0)
    return cuts


def plan_compaction(where: StorageKey, entries: Sequence[tuple[int, Message]], *,
                    keep_last: int | None, keep_last_tokens: int | None,
                    counter: TokenCounter, format: str) -> CompactionPlan | None:
    """What to replace in ``entries`` (the whole conversation), or ``None``: nothing to."""
    split = 0
    while split < len(entries) and entries[split][1]["role"] == "system" \
            and not is_summary(entries[split][1]):
        split += 1
    body = list(entries[split:])
    cuts = _cuts(body)
    cut: int | None = None
    if keep_last is not None:
        cut = next((c for c in reversed(cuts) if len(body) - c >= keep_last), None)
    else:
        assert keep_last_tokens is not None
        fitter = Fitter(keep_last_tokens, counter, format)
        for c in reversed(cuts):  # the tail only grows: stop at the first one over
            if fitter.count([m for _, m in _paired(body[c:])])[1] > keep_last_tokens:
                break
            cut = c
    if cut is None or all(is_summary(m) for _, m in body[:cut]):
        return None
    replaced = body[:cut]
    keys = [key for _, m in replaced if is_summary(m)
            for key in m["metadata"][COMPACTED].get("keys", [])]
    return CompactionPlan(where, [m for _, m in replaced], [p for p, _ in replaced],
                          body[cut][0], digest(replaced), len(entries), keys[-_KEYS_KEPT:])


def summary_message(plan: CompactionPlan, text: Any, key: str | None) -> Message:
    """The summary replacing ``plan``'s messages (``text``: what the summarizer returned)."""
    if not isinstance(text, str):
        raise InvalidInput(f"summarize must return a string, got {type(text).__name__}")
    keys = [*plan.keys, key] if key is not None else plan.keys
    return {"role": "system", "content": text, "metadata": {COMPACTED: {
        "first": plan.positions[0], "last": plan.positions[-1], "count": len(plan.positions),
        "keep": plan.keep, "digest": plan.digest, "keys": keys[-_KEYS_KEPT:]}}}


def compact_entries(entries: Sequence[tuple[int, Message]], position: int,
                    summary: Message) -> list[tuple[int, Message]] | None:
    """The entries after the compaction ``summary`` describes (see the module), or
    ``None`` when no entry stands at ``position``; :class:`CompactionConflict` when the
    range is no longer exactly what was summarized."""
    spec = summary["metadata"][COMPACTED]
    try:
        first, keep, count, expected = (int(spec["first"]), int(spec["keep"]),
                                        int(spec["count"]), str(spec["digest"]))
    except (KeyError, TypeError, ValueError) as error:
        raise InvalidInput(f"metadata.{COMPACTED} is not a compaction's: {error}") from None
    if not any(pos == position for pos, _ in entries):
        return None
    replaced = [(pos, m) for pos, m in entries if first <= pos < keep]
    if (position != first or len(replaced) != count or not replaced
            or replaced[0][0] != first or digest(replaced) != expected
            or not any(pos == keep for pos, _ in entries)):
        raise CompactionConflict("the conversation changed in the range being compacted "
                                 "(an append healed or answered a call there, or an edit)")
    return ([(pos, m) for pos, m in entries if pos < first] + [(first, summary)]
            + [(pos, m) for pos, m in entries if pos >= keep])


def replayed(entries: Sequence[Message], key: str) -> Message | None:
    """The summary an earlier compaction under ``key`` left, if it is still there."""
    for message in entries:
        if message["role"] != "system":
            return None
        if is_summary(message) and key in message["metadata"][COMPACTED].get("keys", []):
            return message
    return None
