"""One seeded workload of realistic agent conversations, as OpenAI Chat dicts.

The workload is an endless, deterministic stream of messages; a conversation
of length N is its first N messages (so every length is a prefix of the
longer ones, and every contender sees exactly the same messages). Each turn:

1. a ``user`` message;
2. an ``assistant`` turn declaring 1-3 tool calls (``content: None``, OpenAI
   ``tool_calls`` entries ``{"id", "type": "function", "function": {...}}``);
3. their ``tool`` results;
4. sometimes (30 %) a second tool round of 1-2 calls and their results;
5. a final ``assistant`` answer.

Faults, as agents really produce them, each of which a provider rejects:
about 5 % of tool results are **re-fired** (the same ``tool_call_id`` again:
half at once, half after the final answer, as a retried tool whose first reply
was not acknowledged); about 4 % of turns are **interrupted** (the last tool
round loses at least one result and the turn has no final answer before the
next ``user`` message); a third of those lost results arrive **late**, right
after that next user message (a slow tool finishing after the user moved on).
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Iterator
from itertools import chain, islice
from typing import Any

DEFAULT_SEED = 20240611
REFIRE_RATE = 0.05
INTERRUPT_RATE = 0.04
SECOND_ROUND_RATE = 0.30
LATE_RATE = 1 / 3

Message = dict[str, Any]

_TOOLS: dict[str, tuple[str, ...]] = {
    "search_web": ("query", "max_results"), "get_weather": ("city", "unit"),
    "read_file": ("path",), "run_sql": ("query",), "http_get": ("url",),
    "list_calendar": ("day", "calendar"), "send_email": ("to", "subject", "body"),
}
_TOPICS = (
    "the quarterly revenue report", "our staging deploy", "the flaky CI job",
    "the weather in Lisbon next week", "the customer ticket #4411", "the pricing page",
    "the onboarding checklist", "last night's on-call incident", "the Postgres migration",
    "the marketing budget", "the API rate limits", "the new hire's laptop order",
)
_VERBS = (
    "Can you summarise", "Please check", "What is the status of", "Find everything about",
    "Compare this week and last week for", "Draft a short note about", "Why did we miss",
)
_WORDS = (
    "latency", "region", "invoice", "deploy", "rollback", "customer", "quota", "shard",
    "metric", "alert", "budget", "forecast", "ticket", "release", "schema", "index",
    "timeout", "retry", "cache", "owner", "deadline", "summary", "draft", "approval",
)


def _text(rng: random.Random, low: int, high: int) -> str:
    """Prose-like text of a length drawn between ``low`` and ``high`` characters."""
    target = int(rng.triangular(low, high, low + (high - low) / 4))
    parts: list[str] = []
    size = 0
    while size < target:
        word = rng.choice(_WORDS)
        parts.append(word)
        size += len(word) + 1
    return " ".join(parts).capitalize() + "."


def _call(rng: random.Random) -> dict[str, Any]:
    name = rng.choice(sorted(_TOOLS))
    args = {arg: _text(rng, 8, 40) for arg in _TOOLS[name]}
    call_id = "call_" + "".join(rng.choices(string.ascii_letters + string.digits, k=24))
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}


def _result(rng: random.Random, call_id: str) -> Message:
    payload = {"ok": True, "items": [_text(rng, 30, 120) for _ in range(rng.randint(1, 6))]}
    return {"role": "tool", "tool_call_id": call_id, "content": json.dumps(payload)}


def _turns(rng: random.Random) -> Iterator[list[Message]]:
    """Turns as lists of messages; late results are prepended after the next user message."""
    late: list[Message] = []
    while True:
        turn: list[Message] = [{
            "role": "user",
            "content": f"{rng.choice(_VERBS)} {rng.choice(_TOPICS)}? " + _text(rng, 20, 200),
        }]
        turn += late
        late = []
        rounds = 2 if rng.random() < SECOND_ROUND_RATE else 1
        interrupted = rng.random() < INTERRUPT_RATE
        after_answer: list[Message] = []
        for number in range(1, rounds + 1):
            calls = [_call(rng) for _ in range(rng.randint(1, 3 if number == 1 else 2))]
            turn.append({"role": "assistant", "content": None, "tool_calls": calls})
            lost: set[int] = set()
            if interrupted and number == rounds:
                lost = {i for i in range(len(calls)) if rng.random() < 0.5}
                lost.add(rng.randrange(len(calls)))
            for index, call in enumerate(calls):
                result = _result(rng, call["id"])
                if index in lost:
                    if rng.random() < LATE_RATE:
                        late.append(result)
                    continue
                turn.append(result)
                if rng.random() < REFIRE_RATE:
                    if rng.random() < 0.5:
                        turn.append(dict(result))  # re-fired at once
                    else:
                        after_answer.append(dict(result))  # re-fired after the answer
        if not interrupted:
            turn.append({"role": "assistant", "content": _text(rng, 150, 900)})
        turn += after_answer
        yield turn


def conversation(length: int, seed: int = DEFAULT_SEED) -> list[Message]:
    """The first ``length`` messages of the endless stream (fresh dicts every call)."""
    return list(islice(chain.from_iterable(_turns(random.Random(seed))), length))


def rest_of_turn(messages: list[Message], start: int) -> int:
    """The index of the first ``user`` message at or after ``start`` (``len`` if none)."""
    for index in range(start, len(messages)):
        if messages[index]["role"] == "user":
            return index
    return len(messages)


def stats(messages: list[Message]) -> dict[str, int]:
    """What a prefix of the stream holds (what a store that keeps everything would show):
    calls, first results, re-fired results, interrupted calls and late results."""
    out = dict.fromkeys(("calls", "results", "refired", "unanswered_calls", "late_results"), 0)
    answered: set[str] = set()
    declared_at: dict[str, int] = {}
    last_user = -1
    for index, message in enumerate(messages):
        role = message["role"]
        if role == "user":
            last_user = index
        elif role == "assistant":
            for call in message.get("tool_calls") or ():
                declared_at[call["id"]] = index
                out["calls"] += 1
        elif role == "tool":
            call = message["tool_call_id"]
            if call in answered:
                out["refired"] += 1
            else:
                answered.add(call)
                out["results"] += 1
                out["late_results"] += declared_at.get(call, -1) < last_user
    # unanswered in its turn: no result at all, or a late one (after the next user message)
    out["unanswered_calls"] = sum(c not in answered for c in declared_at) + out["late_results"]
    return {"messages": len(messages), **out}
