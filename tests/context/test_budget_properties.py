"""Token budgets on read, over generated conversations (Hypothesis, seeded).

Conversations with tool calls, re-fires, interrupted (healed) and late results
are appended through a real :class:`flowmem.Memory`; every budgeted read, in
every dialect, must be sendable (``flowmem.is_sendable`` on its structure, the
provider's own sequence rules) and valid for the SDK's param types, within the
budget, and maximal: the next older turn would exceed it. The same
conversations trimmed by LangChain's ``trim_messages`` are checked the same
way and their provider-invalid outputs counted (recorded as figures).
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, note, seed, settings
from hypothesis import strategies as st

from figures import Figure
from flowmem import Memory, formats, is_sendable
from flowmem.context import approximate, fit
from flowmem.context._budget import _paired, clean, countable, leading_system, render_for
from flowmem.messages import coerce_content
from flowmem.normalize import repair_pairing
from formats_support import WRITERS, call_results, conversations, type_errors

DIALECTS = ("canonical", "openai", "responses", "anthropic")
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
budgets = st.integers(0, 600)


def _stored(events: list[dict[str, Any]], dialects: list[str]) -> Memory:
    memory = Memory.from_url("memory://")
    for index, event in enumerate(events):
        dialect = dialects[index % len(dialects)]
        memory.append("global", "c", formats.to_canonical(WRITERS[dialect](event), dialect),
                      context=None)
    return memory


def _structure(output: Any, dialect: str) -> list[dict[str, Any]]:
    """What ``is_sendable`` checks, for any dialect: the output read back, text content."""
    canonical = output if dialect == "canonical" else formats.to_canonical(output, dialect)
    return [{**m, "content": coerce_content(m.get("content")) if not isinstance(
        m.get("content"), list) else "parts"} for m in canonical]


def provider_problems(output: Any, dialect: str) -> list[str]:
    """Why a provider (or flowmem's MEM-5 check) would refuse ``output`` ([]: accepted)."""
    problems = [] if is_sendable(_structure(output, dialect)) else ["not sendable (MEM-5)"]
    if dialect == "canonical":
        return problems
    problems += [str(p) for p in formats.check(output, dialect)
                 if p.rule != "anthropic.messages" or output["messages"]]
    refused = type_errors(output, dialect)[1]
    return problems + (["SDK types refuse it"] if refused else [])


def _tokens(messages: list[dict[str, Any]], dialect: str) -> int:
    return approximate(countable(render_for(messages, dialect), dialect))


@seed(20240611)
@SETTINGS
@given(conversations(), st.lists(st.sampled_from(("openai", "responses", "anthropic")),
                                 min_size=1, max_size=3), budgets, st.sampled_from(DIALECTS))
def test_budgeted_history_is_sendable_within_budget_and_maximal(
        events: list[dict[str, Any]], writers: list[str], budget: int, dialect: str) -> None:
    memory = _stored(events, writers)
    stored = memory.history("global", "c", context=None).messages
    result = memory.history("global", "c", context=None, max_tokens=budget, format=dialect)
    note(f"stored={stored}\nresult={result}")
    assert result.messages == fit(stored, budget, format=dialect).messages  # paged == whole
    output = render_for(result.messages, dialect)
    assert provider_problems(output, dialect) == []
    assert result.tokens == approximate(countable(output, dialect)) <= budget
    kept_stored = [p for p in result.positions if p >= 0]
    assert result.omitted == len(stored) - len(kept_stored)
    # maximal: the next older whole turn (a user message; or the first message) would exceed
    entries = list(zip(range(len(stored)), stored, strict=True))
    split = leading_system(entries)
    head, body = entries[:split], entries[split:]
    positions = memory.history("global", "c", context=None).positions
    kept_body = [positions.index(p) - split for p in kept_stored if positions.index(p) >= split]
    start = min(kept_body) if kept_body else len(body)
    older = [i for i in range(start) if body[i][1]["role"] == "user" or i == 0]
    if older and (kept_stored or _tokens([m for _, m in head], dialect) <= budget):
        trial = [m for _, m in head] + [m for _, m in _paired(body[older[-1]:])]
        assert _tokens(trial, dialect) > budget
    # whole units: a kept result's call is kept, a kept call's results are kept
    assert is_sendable(_structure(result.messages, "canonical"))


def _opaque(messages: Any) -> int:
    """The default counter seen as any callable: the budget cannot sum it a message at a time."""
    return approximate(messages)


@seed(20240613)
@SETTINGS
@given(conversations(), st.lists(st.sampled_from(("openai", "responses", "anthropic")),
                                 min_size=1, max_size=3), budgets)
def test_summing_a_clean_run_answers_what_rendering_and_counting_answers(
        events: list[dict[str, Any]], writers: list[str], budget: int) -> None:
    """The canonical fast path (a clean run, the built-in additive counter: costs summed a
    message at a time) keeps exactly what the general path (render, count the output)
    keeps, counted the same; paged through the store and over the whole list alike."""
    memory = _stored(events, writers)
    stored = memory.history("global", "c", context=None).messages
    general = fit(stored, budget, counter=_opaque)
    for fitted in (fit(stored, budget), memory.history("global", "c", context=None,
                                                      max_tokens=budget)):
        assert fitted.messages == general.messages
        assert fitted.tokens == general.tokens
    assert memory.history("global", "c", context=None, max_tokens=budget,
                          counter=_opaque).messages == general.messages


def test_clean_runs_are_what_the_repair_leaves_alone() -> None:
    """:func:`clean` says yes only where MEM-5's repair changes nothing (seeded)."""
    rng = random.Random(20240614)
    seen: Counter[bool] = Counter()
    for _ in range(200):
        stored = _stored(seeded_conversation(rng), ["openai"]).history(
            "global", "c", context=None).messages
        entries = list(enumerate(stored))
        body = entries[leading_system(entries):]
        for start in [i for i, (_, m) in enumerate(body) if m["role"] == "user"]:
            run = [m for _, m in body[start:]]
            verdict = clean(body[start:])
            seen[verdict] += 1
            if verdict:
                repaired = repair_pairing(run)[0]
                assert len(repaired) == len(run)
                assert all(a is b for a, b in zip(repaired, run, strict=True))
    assert seen[True] and seen[False]  # both answers are exercised


def _trimmed(stored: list[dict[str, Any]], budget: int, start_on: str | None) -> list[Any]:
    from langchain_core.messages import convert_to_openai_messages, trim_messages

    from flowmem.integrations.langchain import from_entries

    def count(messages: list[Any]) -> int:
        return approximate(convert_to_openai_messages(messages))

    return convert_to_openai_messages(trim_messages(
        from_entries(stored), max_tokens=budget, token_counter=count, strategy="last",
        start_on=start_on, include_system=True, allow_partial=False))


def seeded_conversation(rng: random.Random) -> list[dict[str, Any]]:
    """One conversation as ``formats_support.conversations`` draws them, from a seeded RNG:
    tool calls with re-fired, lost (healed at the next user turn) and late results."""
    events: list[dict[str, Any]] = []
    if rng.random() < 0.7:
        events.append({"kind": "system", "text": "be brief", "developer": False})
    late: list[dict[str, Any]] = []
    counter = 0
    for turn in range(rng.randint(1, 6)):
        events.append({"kind": "user", "text": f"question {turn} " * rng.randint(1, 8),
                       "image": rng.random() < 0.1})
        events.extend(late)
        late = []
        interrupted = False
        for _round in range(rng.randint(0, 3)):
            calls = []
            for _ in range(rng.randint(1, 3)):
                counter += 1
                calls.append((f"call_{counter}", "search", {"q": "cats", "n": counter}))
            events.append({"kind": "assistant", "text": None, "calls": calls,
                           "thinking": False, "reasoning": False})
            if call_results(calls, lambda: rng.choice(["ok"] * 6 + ["refire", "lost", "late"]),
                            lambda: "found " * rng.randint(1, 30), events, late):
                interrupted = True
        if not interrupted:
            events.append({"kind": "assistant", "text": "done " * rng.randint(1, 10),
                           "calls": [], "thinking": False, "reasoning": False})
    return events


COMPARED = 300


def test_against_trim_messages_on_the_same_conversations(figure: Figure) -> None:
    """flowmem's budgeted outputs are always accepted; trim_messages' refusals are counted."""
    rng = random.Random(20240612)
    tally: Counter[str] = Counter()
    names = ("trim_messages(start_on='human')", "trim_messages(start_on=None)")
    for _ in range(COMPARED):
        stored = _stored(seeded_conversation(rng), ["openai"]).history(
            "global", "c", context=None).messages
        budget = rng.randint(20, 600)
        for dialect in ("openai", "responses", "anthropic"):
            output = fit(stored, budget, format=dialect).output
            assert provider_problems(output, dialect) == [], dialect
        for name, start_on in zip(names, ("human", None), strict=True):
            if provider_problems(_trimmed(stored, budget, start_on), "openai"):
                tally[name] += 1
    figure(f"\non {COMPARED} conversations (seeded), provider-invalid outputs: flowmem "
           f"max_tokens 0 in each of 3 dialects; OpenAI Chat from "
           + ", ".join(f"{n} {tally[n]}" for n in names))
    assert tally[names[1]] > 0  # the comparison has teeth: trim_messages does fail here
