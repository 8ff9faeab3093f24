"""Is a stored history provider-sendable? Count what a provider would reject.

Each contender's adapter converts its read-back history to OpenAI Chat dicts;
this module walks it once and counts:

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
(``content: null`` read as ``""``, as provider SDKs send it); a history is
**sendable** when it is 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from flowmem.messages import HEALED_CONTENT
from flowmem.normalize import sendability_problems


def count(history: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Count duplicates, dangling calls, orphan results and healed placeholders."""
    messages = list(history)
    answered: set[str] = set()
    block: dict[str, bool] = {}  # the calls of the turn whose results follow: answered?
    n = dict.fromkeys(("duplicates", "dangling", "orphans", "healed"), 0)
    for message in messages:
        if message.get("role") != "tool":
            n["dangling"] += sum(not done for done in block.values())
            block = {str(call["id"]): False for call in message.get("tool_calls") or ()
                     if isinstance(call, Mapping) and call.get("id")}
            continue
        call = str(message.get("tool_call_id") or "")
        n["healed"] += message.get("content") == HEALED_CONTENT
        if call in answered:
            n["duplicates"] += 1
        elif block.get(call) is False:
            block[call] = True
        else:
            n["orphans"] += 1
        answered.add(call)
    n["dangling"] += sum(not done for done in block.values())
    # content null on a tool-calling turn is what provider SDKs send: read it as ""
    as_sent = [{**m, "content": ""} if m.get("content") is None else m for m in messages]
    problems = len(sendability_problems(as_sent))
    return {"messages": len(messages), **n, "problems": problems, "sendable": problems == 0}


def canonical_to_openai(messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """flowmem's canonical shape (pairing fields in ``metadata``) to flat OpenAI dicts:
    a plain field move, no repair (``content: None`` reads as ``""``, as SDKs send it)."""
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
