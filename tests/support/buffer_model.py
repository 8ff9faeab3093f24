"""Hypothesis strategies of realistic conversations and a naive reference model of append.

Shared by the buffer's property tests and every other test that needs random
conversations (MEM-1, 2, 3, 10, 11, 14 and the window).
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st

from flowmem import append, healed_placeholder
from flowmem.ids import declared_call_ids, is_healed, result_id
from flowmem.messages import canonical_messages

Msg = dict[str, Any]

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

# A small pool: "c1" and " c1 " are the same call, and so are 7 and "7" (MEM-11).
USABLE_IDS = ["c0", "c1", "c2", "c3", "c4", " c1 ", 7, "7"]
UNUSABLE_IDS: list[Any] = ["", "0", "  ", 0, None]

usable_call_ids = st.sampled_from(USABLE_IDS)
any_call_ids = st.sampled_from(USABLE_IDS * 3 + UNUSABLE_IDS)
texts = st.sampled_from(["", "hi", "find cats", "thinking", "Found 3 cats", "ok", " "])


@st.composite
def call_entries(draw: st.DrawFn) -> Msg:
    cid = draw(any_call_ids)
    if draw(st.booleans()):  # provider-flat spelling
        return {"id": cid, "type": "function",
                "function": {"name": "search", "arguments": "{}"}}
    return {"tool_call_id": cid, "name": "search"}


@st.composite
def assistant_turns(draw: st.DrawFn) -> Msg:
    calls = draw(st.lists(call_entries(), max_size=3))
    content = draw(st.one_of(texts, st.none()))
    message: Msg = {"role": "assistant", "content": content}
    if calls or draw(st.booleans()):
        if draw(st.booleans()):
            message["tool_calls"] = calls
        else:
            message["metadata"] = {"tool_calls": calls}
    return message


@st.composite
def tool_results(draw: st.DrawFn, ids: st.SearchStrategy[Any] = any_call_ids) -> Msg:
    cid = draw(ids)
    content = draw(texts)
    healed = draw(st.sampled_from([False, False, False, False, True]))
    fields: Msg = {"tool_call_id": cid}
    if healed:
        fields["healed"] = True
    if draw(st.booleans()):
        return {"role": "tool", "content": content, **fields}
    return {"role": "tool", "content": content, "metadata": fields}


def users() -> st.SearchStrategy[Msg]:
    return texts.map(lambda text: {"role": "user", "content": text})


def systems() -> st.SearchStrategy[Msg]:
    return texts.map(lambda text: {"role": "system", "content": text})


messages = st.one_of(users(), assistant_turns(), assistant_turns(), tool_results(),
                     tool_results(), systems())
# one append call: a single message, or a list of up to four
operations = st.one_of(messages, st.lists(messages, min_size=0, max_size=4))
sequences = st.lists(operations, min_size=1, max_size=14)
windows = st.one_of(st.none(), st.integers(min_value=1, max_value=8))


def _one_result_per_id(buffer: list[Msg]) -> bool:
    counts = Counter(cid for m in canonical_messages(buffer) if (cid := result_id(m)))
    return all(n == 1 for n in counts.values())


# A buffer that was NOT built through append (raw provider-flat or canonical
# turns). Duplicate results are left out: the window mishandles them (xfail
# tests in test_buffer_rules.py, section "a buffer handed in").
raw_buffers = st.lists(messages, max_size=6).filter(_one_result_per_id)


def show(**arguments: Any) -> None:
    """Print the arguments with a failing example (this environment's Hypothesis
    prints them blank in "Falsifying example")."""
    for name, value in arguments.items():
        note(f"{name} = {value!r}")


def as_list(operation: Any) -> list[Msg]:
    return [operation] if isinstance(operation, dict) else list(operation)


def fold(buffer: list[Msg], ops: list[Any], max_messages: int | None) -> list[Any]:
    """The results of folding the pure :func:`flowmem.append` over ``ops``."""
    results = []
    for op in ops:
        result = append(buffer, op, max_messages=max_messages)
        results.append(result)
        buffer = result.messages
    return results


# --------------------------------------------------------------------------- a reference model
# A naive, O(n)-per-message reading of the spec, written independently of
# flowmem.plan and flowmem.buffer (ids are read through flowmem.ids, the one id
# reader MEM-11 requires).


def _ref_heal(buf: list[Msg]) -> None:
    answered = {result_id(m) for m in buf} - {None}
    first: dict[str, tuple[int, int]] = {}
    for index, message in enumerate(buf):
        for order, cid in enumerate(declared_call_ids(message)):
            if cid not in answered and cid not in first:
                first[cid] = (index, order)
    by_turn: dict[int, list[tuple[int, str]]] = {}
    for cid, (index, order) in first.items():
        by_turn.setdefault(index, []).append((order, cid))
    for index in sorted(by_turn, reverse=True):
        end = index
        while end + 1 < len(buf) and buf[end + 1]["role"] == "tool":
            end += 1
        buf[end + 1:end + 1] = [healed_placeholder(cid) for _, cid in sorted(by_turn[index])]


def ref_append(buffer: list[Msg], incoming: Any,
               max_messages: int | None) -> tuple[list[Msg], int]:
    buf = copy.deepcopy(buffer)
    appended = 0
    for message in canonical_messages(incoming):
        role = message["role"]
        if role == "tool":
            cid = result_id(message)
            holders = [i for i, m in enumerate(buf) if cid is not None and result_id(m) == cid]
            if not holders:
                buf.append(message)
                appended += 1
            elif is_healed(buf[holders[0]]) and not is_healed(message):
                buf[holders[0]] = message  # MEM-10
            continue  # MEM-1
        if role == "assistant":
            ids = declared_call_ids(message)
            declared = {cid for m in buf for cid in declared_call_ids(m)}
            if ids and all(cid in declared for cid in ids):
                continue  # MEM-2
        elif role == "user":
            _ref_heal(buf)  # MEM-3
        buf.append(message)
        appended += 1
    if max_messages is not None and len(buf) > max_messages:
        victims, buf = buf[:len(buf) - max_messages], buf[len(buf) - max_messages:]
        kept = {cid for m in buf for cid in declared_call_ids(m)}
        dead = {cid for m in victims for cid in declared_call_ids(m)} - kept
        buf = [m for m in buf if result_id(m) is None or result_id(m) not in dead]
    return buf, appended


# --------------------------------------------------------------------------- invariants


def unanswered(buf: list[Msg]) -> set[str]:
    declared = {cid for m in buf for cid in declared_call_ids(m)}
    answered = {result_id(m) for m in buf}
    return declared - answered


def results_per_id(buf: list[Msg]) -> Counter[str]:
    return Counter(cid for m in buf if (cid := result_id(m)) is not None)


# --------------------------------------------------------------------------- properties
