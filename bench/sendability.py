"""Is a stored history provider-sendable? Count what a provider would reject.

Every contender's read-back history is first converted to OpenAI Chat dicts
(``{"role", "content", "tool_calls"?, "tool_call_id"?}``) by its adapter;
this module then walks it once and counts:

``duplicates``
    ``tool`` messages whose ``tool_call_id`` was already answered earlier in
    the list (a re-fired result that was stored twice).
``dangling``
    declared calls with no result in the contiguous block of ``tool``
    messages right after the ``assistant`` turn that declares them (an
    interrupted call, or one whose result came too late).
``orphans``
    first results for an id that sit outside the block of the turn that
    declared it (a late result after a user message, or a result whose call
    was never declared).
``healed``
    results carrying flowmem's interrupted-call placeholder text (not a
    problem: what makes an interrupted history sendable again).

``problems`` is, as a cross-check, the number of breaches flowmem's own
:func:`flowmem.normalize.sendability_problems` reports on the same list
(``content: null`` read as ``""``, as provider SDKs send it).
A history is **sendable** when ``problems`` is 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from flowmem.messages import HEALED_CONTENT
from flowmem.normalize import sendability_problems

__all__ = ["Sendability", "canonical_to_openai", "count"]


@dataclass(frozen=True)
class Sendability:
    """Counts over one history; see the module notes."""

    messages: int
    duplicates: int
    dangling: int
    orphans: int
    healed: int
    problems: int

    @property
    def sendable(self) -> bool:
        return self.problems == 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "sendable": self.sendable}


def _call_ids(message: Mapping[str, Any]) -> list[str]:
    ids = []
    for call in message.get("tool_calls") or ():
        if isinstance(call, Mapping) and call.get("id"):
            ids.append(str(call["id"]))
    return ids


def count(history: Iterable[Mapping[str, Any]]) -> Sendability:
    """Count duplicates, dangling calls, orphan results and healed placeholders."""
    messages = list(history)
    answered: set[str] = set()
    block: dict[str, bool] | None = None
    duplicates = dangling = orphans = healed = 0

    def close() -> int:
        return sum(1 for done in block.values() if not done) if block is not None else 0

    for message in messages:
        if message.get("role") == "tool":
            call = str(message.get("tool_call_id") or "")
            if message.get("content") == HEALED_CONTENT:
                healed += 1
            if call in answered:
                duplicates += 1
                continue
            answered.add(call)
            if block is not None and block.get(call) is False:
                block[call] = True
            else:
                orphans += 1
            continue
        dangling += close()
        block = None
        if message.get("role") == "assistant":
            block = dict.fromkeys(_call_ids(message), False)
    dangling += close()
    # content null on a tool-calling turn is what provider SDKs send: read it as ""
    as_sent = [{**m, "content": ""} if m.get("content") is None else m for m in messages]
    return Sendability(len(messages), duplicates, dangling, orphans, healed,
                       len(sendability_problems(as_sent)))


def canonical_to_openai(messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """flowmem's canonical shape (pairing fields in ``metadata``) to flat OpenAI dicts.

    A plain field move, no repair: ``content: None`` reads as ``""`` (as every
    provider SDK sends it), ``tool_calls`` and ``tool_call_id`` come out of
    ``metadata``.
    """
    out: list[dict[str, Any]] = []
    for message in messages:
        metadata = message.get("metadata") or {}
        content = message.get("content")
        flat: dict[str, Any] = {"role": message["role"],
                                "content": "" if content is None else content}
        if metadata.get("tool_calls"):
            flat["tool_calls"] = metadata["tool_calls"]
        if metadata.get("tool_call_id") is not None:
            flat["tool_call_id"] = metadata["tool_call_id"]
        out.append(flat)
    return out
