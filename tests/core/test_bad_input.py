"""Bad input through ``Memory``, on ``memory://`` AND ``sqlite://`` side by side.

Every input is either stored faithfully (read back exactly, types included)
or refused with a typed error — a :class:`~flowmem.FlowmemError` that is
also a ``ValueError`` or ``TypeError``, never a ``RecursionError`` or a
driver's exception — and the SAME on both backends. After a refusal the
conversation and the value already stored are unchanged, and the buffer is
usable: the next valid append gives exactly what the pure model
(:func:`flowmem.append`) gives.
"""

from __future__ import annotations

import datetime
import decimal
import enum
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from figures import Figure
from flowmem import ExecutionContext, FlowmemError
from flowmem import append as model_append
from flowmem.memory import Memory

SCOPE = "session"
CTX = ExecutionContext(session_id="bad-input", node_id="n", pipeline_id="p", workflow_id="w")
CONV, VAL = "conv", "val"
SEED = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "find cats"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "3 cats"},
]  # c2 is still open: the next user turn heals it (MEM-3)
SEED_VALUE = {"keep": [1, "two", None]}


def _deep_list(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = [value]
    return value


def _deep_dict(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = {"d": value}
    return value


class _Opaque:
    pass


class _Color(enum.IntEnum):
    RED = 1


class _Text(str):
    pass


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[dict[str, Memory]]:
    """The two embedded backends, each seeded with the same conversation and value."""
    memories = {"memory://": Memory.from_url("memory://"),
                "sqlite://": Memory.from_url(f"sqlite:///{tmp_path / 'bad.db'}"
                                             "?synchronous=normal")}
    for memory in memories.values():
        memory.append(SCOPE, CONV, SEED, context=CTX)
        memory.write(SCOPE, VAL, SEED_VALUE, context=CTX)
    yield memories
    for memory in memories.values():
        memory.close()


def _state(memory: Memory) -> tuple[Any, Any]:
    return (memory.read(SCOPE, CONV, context=CTX).value,
            memory.read(SCOPE, VAL, context=CTX).value)


def _strict(value: Any) -> Any:
    """``value`` with every scalar tagged by its exact type (so 1 != True != 1.0, str != S)."""
    if isinstance(value, dict):
        return ("dict", {k: _strict(v) for k, v in value.items()})
    if isinstance(value, list):
        return ("list", [_strict(v) for v in value])
    if isinstance(value, float) and value == 0:
        return (type(value).__name__, math.copysign(1.0, value))
    return (type(value).__name__, value)


Outcome = tuple[str, Any]


def _attempt(memory: Memory, action: Callable[[Memory], Any]) -> Outcome:
    """``("stored", what was read back)`` or ``("refused", error class name)``."""
    try:
        return "stored", action(memory)
    except FlowmemError as exc:
        if not isinstance(exc, ValueError | TypeError):
            return "untyped", f"{type(exc).__name__} is neither ValueError nor TypeError"
        return "refused", type(exc).__name__
    except RecursionError:
        return "untyped", "RecursionError"
    except Exception as exc:  # a driver's or the interpreter's error leaked
        return "untyped", f"{type(exc).__name__}: {str(exc)[:80]}"


def _usable(memory: Memory) -> bool:
    """A valid user turn appends exactly as the model says (healing c2 if still open)."""
    before = memory.read(SCOPE, CONV, context=CTX).value
    turn = {"role": "user", "content": "still there?"}
    got = memory.append(SCOPE, CONV, turn, context=CTX)
    want = model_append(before, turn)
    ok = (got.count, got.appended, got.messages) == (want.count, want.appended, want.messages)
    # put the conversation back the way the next case expects it
    memory.delete(SCOPE, CONV, context=CTX)
    memory.append(SCOPE, CONV, SEED, context=CTX)
    return ok


def _run_cases(pair: dict[str, Memory], cases: dict[str, Callable[[Memory], Any]],
               expect: dict[str, str]) -> tuple[dict[str, Outcome], list[str]]:
    """Run every case on both backends; returns outcomes and the problems found."""
    problems: list[str] = []
    outcomes: dict[str, Outcome] = {}
    for name, action in cases.items():
        seen: dict[str, Outcome] = {}
        for backend, memory in pair.items():
            before = _state(memory)
            outcome = _attempt(memory, action)
            seen[backend] = outcome
            if outcome[0] == "untyped":
                problems.append(f"{name} on {backend}: {outcome[1]}")
            if outcome[0] == "refused" and _state(memory) != before:
                problems.append(f"{name} on {backend}: refused but the data changed")
            if not _usable(memory):
                problems.append(f"{name} on {backend}: buffer not usable afterwards")
        first, second = seen.values()
        if (first[0], _strict(first[1])) != (second[0], _strict(second[1])):
            problems.append(f"{name}: memory:// {first!r:.120} vs sqlite:// {second!r:.120}")
        if expect.get(name) and first[0] != expect[name]:
            problems.append(f"{name}: expected {expect[name]}, got {first!r:.120}")
        outcomes[name] = first
    return outcomes, problems


def _tally(outcomes: dict[str, Outcome]) -> str:
    stored = sum(1 for o in outcomes.values() if o[0] == "stored")
    refused: dict[str, int] = {}
    for kind, what in outcomes.values():
        if kind == "refused":
            refused[what] = refused.get(what, 0) + 1
    return f"{stored} stored faithfully, refused {refused}"


# -- values -------------------------------------------------------------------------------


def _write(value: Any, key: str = VAL) -> Callable[[Memory], Any]:
    def action(memory: Memory) -> Any:
        result = memory.write(SCOPE, key, value, context=CTX)
        assert result.ok
        return memory.read(SCOPE, key, context=CTX).value

    return action


BAD_VALUES: dict[str, Any] = {
    "set": {1, 2}, "frozenset": frozenset({1}), "object": _Opaque(), "NaN": math.nan,
    "inf": math.inf, "-inf": -math.inf, "NaN nested": {"a": [1, math.nan]},
    "bytes": b"\x00\xff", "bytearray": bytearray(b"x"), "complex": 1j,
    "Decimal": decimal.Decimal("1.5"), "datetime": datetime.datetime(2026, 1, 1),
    "int dict key": {1: "a"}, "tuple dict key": {(1, 2): "a"}, "None dict key": {None: 1},
    "10,000-deep list": _deep_list(10_000), "10,000-deep dict": _deep_dict(10_000),
    "101-deep list": _deep_list(101), "function": len,
}
GOOD_VALUES: dict[str, Any] = {
    "lone surrogates": "\ud800 a \udfff", "NUL": "a\u0000b", "NUL and surrogate keys":
    {"\u0000": 1, "\udbff": [2], "": None}, "unicode": "é 漢 🙂 \u200b", "empty": "",
    "-0.0": -0.0, "1e308": 1e308, "5e-324": 5e-324, "2**63": 2**63, "-(10**400)": -(10**400),
    "bool vs int": [True, 1, 1.0, False, 0], "tuple": (1, (2, "3")), "100-deep list":
    _deep_list(100), "mixed": {"a": [{"b": None}], "c": {"d": [1.5, "x"]}},
}
EXPECT_VALUES = {**dict.fromkeys(BAD_VALUES, "refused"), **dict.fromkeys(GOOD_VALUES, "stored")}
JSON_SHAPE = {"tuple": [1, [2, "3"]]}


def test_mem7_write_refuses_non_json_values_and_stores_json_faithfully(
        pair: dict[str, Memory], figure: Figure) -> None:
    cases = {name: _write(value) for name, value in {**BAD_VALUES, **GOOD_VALUES}.items()}
    outcomes, problems = _run_cases(pair, cases, EXPECT_VALUES)
    for name, value in GOOD_VALUES.items():
        want = JSON_SHAPE.get(name, value)
        if outcomes[name][0] == "stored" and _strict(outcomes[name][1]) != _strict(want):
            problems.append(f"{name}: read back {outcomes[name][1]!r:.80}, wrote {want!r:.80}")
    for name in BAD_VALUES:
        if outcomes[name] != ("refused", "InvalidValue"):
            problems.append(f"{name}: {outcomes[name]!r:.80} (want InvalidValue)")
    figure(f"\nbad values x 2 backends: {len(cases)} cases, {_tally(outcomes)}; "
          f"problems {len(problems)}")
    assert problems == []


def test_mem7_ten_megabyte_value_round_trips(pair: dict[str, Memory], figure: Figure) -> None:
    big = ("0123456789abcdef" * 65_536) * 10  # 10 MiB
    started = time.perf_counter()
    outcomes, problems = _run_cases(pair, {"10 MiB string": _write(big)}, {})
    seconds = time.perf_counter() - started
    figure(f"\n10 MiB value: {_tally(outcomes)} on both backends in {seconds:.2f}s; "
          f"problems {len(problems)}")
    assert problems == []
    assert outcomes["10 MiB string"][1] == big


# -- messages -------------------------------------------------------------------------------


def _append(incoming: Any, **kwargs: Any) -> Callable[[Memory], Any]:
    def action(memory: Memory) -> Any:
        before = memory.read(SCOPE, CONV, context=CTX).value
        got = memory.append(SCOPE, CONV, incoming, context=CTX, **kwargs)
        want = model_append(before, incoming, **kwargs)
        assert (got.count, got.appended) == (want.count, want.appended)
        stored = memory.read(SCOPE, CONV, context=CTX).value
        assert stored == want.messages
        return stored[len(before) - want.count:] if want.count < len(before) else stored

    return action


def _user(content: Any, **fields: Any) -> dict[str, Any]:
    return {"role": "user", "content": content, **fields}


BAD_MESSAGES: dict[str, Any] = {
    "content set": _user({1}), "content object": _user(_Opaque()), "content NaN": _user(math.nan),
    "content bytes": _user(b"hi"), "content inf in list": _user([1, math.inf]),
    "content 10,000 deep": _user(_deep_list(10_000)),
    "metadata 10,000 deep": _user("x", metadata={"m": _deep_dict(10_000)}),
    "extra field 10,000 deep": _user("x", extra=_deep_list(10_000)),
    "metadata not a mapping": _user("x", metadata=["a"]), "field name not a string":
    {"role": "user", "content": "x", 1: "y"}, "metadata key not a string":
    _user("x", metadata={2: "y"}),
    "string": "hello", "int": 42, "None": None, "bytes": b"{}", "generator":
    (m for m in [_user("x")]), "set of messages": {"x"},
    "list holding a list": [[_user("x")]], "list holding a string": ["hello"],
    "valid then invalid (all or nothing)": [_user("fine"), {"role": "user", "content": {1}}],
    "valid then non-mapping": [_user("fine"), 7],
    "role developer": {"role": "developer", "content": "x"}, "role USER": _user("x") | {
        "role": "USER"}, "role empty": {"role": "", "content": "x"}, "role missing":
    {"content": "x"}, "role None": {"role": None, "content": "x"}, "role int":
    {"role": 1, "content": "x"}, "role bytes": {"role": b"user", "content": "x"},
    "tool_calls not a list": {"role": "assistant", "content": None, "tool_calls": "c9"},
    "tool call not a mapping": {"role": "assistant", "content": None, "tool_calls": ["c9"]},
}
GOOD_MESSAGES: dict[str, Any] = {
    "lone surrogates and NUL in content": _user("a\ud800b\u0000c\udfff"),
    "NUL and surrogates in metadata": _user("x", metadata={"\u0000k": "\udbff\u0000"}),
    "multimodal content": _user([{"type": "text", "text": "hi"},
                                 {"type": "image_url", "image_url": {"url": "data:,"}}]),
    "content None": {"role": "assistant", "content": None}, "content int": _user(7),
    "content big int": _user(10**400), "content -0.0": _user(-0.0),
    "content 98 deep": _user(_deep_list(98)),
    "tool id with NUL (no usable id: appended as is)":
    {"role": "tool", "tool_call_id": "c2\u0000", "content": "r"},
    "tool id lone surrogate": {"role": "tool", "tool_call_id": "\ud800", "content": "r"},
    "call id with NUL declares nothing": {"role": "assistant", "content": None,
                                          "tool_calls": [{"id": "\u0000"}]},
    "tool id 0 (unusable)": {"role": "tool", "tool_call_id": 0, "content": "r"},
    "tool id 100,000 chars": {"role": "tool", "tool_call_id": "i" * 100_000, "content": "r"},
    "healed given as a string": {"role": "tool", "tool_call_id": "c2", "content": "r",
                                 "metadata": {"healed": "true"}},
    "empty list": [], "tuple of messages": (_user("a"), _user("b")),
}
EXPECT_MESSAGES = {**dict.fromkeys(BAD_MESSAGES, "refused"),
                   **dict.fromkeys(GOOD_MESSAGES, "stored")}


def test_mem14_bad_messages_refused_typed_good_ones_stored_consistently(
        pair: dict[str, Memory], figure: Figure) -> None:
    cases = {name: _append(m) for name, m in {**BAD_MESSAGES, **GOOD_MESSAGES}.items()}
    # generators are consumed by the first backend: give each backend its own
    cases["generator"] = lambda memory: _append(m for m in [_user("x")])(memory)
    outcomes, problems = _run_cases(pair, cases, EXPECT_MESSAGES)
    figure(f"\nbad messages x 2 backends: {len(cases)} cases, {_tally(outcomes)}; "
          f"problems {len(problems)}")
    assert problems == []


def test_mem14_ten_megabyte_content_round_trips(pair: dict[str, Memory], figure: Figure) -> None:
    big = "x" * (10 * 1024 * 1024 - 7) + "\u0000\ud800é漢🙂"
    started = time.perf_counter()
    outcomes, problems = _run_cases(pair, {"10 MiB content": _append(_user(big))}, {})
    seconds = time.perf_counter() - started
    tail = {name: memory.history(SCOPE, CONV, context=CTX, last=1).messages
            for name, memory in pair.items()}
    figure(f"\n10 MiB content: {_tally(outcomes)} on both backends in {seconds:.2f}s; "
          f"problems {len(problems)}")
    assert problems == []
    assert outcomes["10 MiB content"][1][-1]["content"] == big
    assert tail["memory://"] == tail["sqlite://"]


@pytest.mark.parametrize("window", [0, -1, True, False, 1.5, "3", [], None.__class__])
def test_mem14_bad_max_messages_is_invalid_input_and_changes_nothing(
        pair: dict[str, Memory], window: Any, figure: Figure) -> None:
    outcomes, problems = _run_cases(
        pair, {f"max_messages={window!r}": _append(_user("x"), max_messages=window)},
        {f"max_messages={window!r}": "refused"})
    figure(f"\nmax_messages={window!r}: {outcomes}; problems {len(problems)}")
    assert problems == []
    assert next(iter(outcomes.values())) == ("refused", "InvalidInput")


# -- keys and paging ------------------------------------------------------------------------


BAD_KEYS: dict[str, Any] = {
    "empty": "", "NUL": "\u0000", "inner NUL": "a\u0000b", "lone surrogate": "\ud800",
    "surrogate inside": "ab\udfffc", "513 chars": "k" * 513, "None": None, "int": 5,
    "bytes": b"k", "list": ["k"],
}
GOOD_KEYS: dict[str, str] = {
    "512 chars": "k" * 512, "512 two-byte chars": "é" * 512, "512 astral chars": "🙂" * 512,
    "space": " ", "tab": "\t", "dots and slashes": "../a/./b", "SQL": "'; DROP TABLE kv; --",
    "like wildcards": "%_", "NFD e-acute": "e\u0301",
}


def _key_ops(key: Any) -> dict[str, Callable[[Memory], Any]]:
    return {
        "read": lambda m: m.read(SCOPE, key, context=CTX).found,
        "write": lambda m: m.write(SCOPE, key, 1, context=CTX).ok,
        "delete": lambda m: m.delete(SCOPE, key, context=CTX).found,
        "append": lambda m: m.append(SCOPE, key, _user("x"), context=CTX).count,
        "history": lambda m: len(m.history(SCOPE, key, context=CTX).messages),
    }


def test_mem11_bad_keys_refused_on_every_operation(pair: dict[str, Memory], figure: Figure) -> None:
    cases = {f"{op} key={name}": action for name, key in BAD_KEYS.items()
             for op, action in _key_ops(key).items()}
    outcomes, problems = _run_cases(pair, cases, dict.fromkeys(cases, "refused"))
    for name, outcome in outcomes.items():
        if outcome != ("refused", "InvalidInput"):
            problems.append(f"{name}: {outcome!r:.80} (want InvalidInput)")
    figure(f"\nbad keys x 5 operations x 2 backends: {len(cases)} cases, {_tally(outcomes)}; "
          f"problems {len(problems)}")
    assert problems == []


def test_mem11_edge_keys_stored_and_kept_apart(pair: dict[str, Memory], figure: Figure) -> None:
    def round_trip(key: str) -> Callable[[Memory], Any]:
        def action(memory: Memory) -> Any:
            memory.write(SCOPE, key, {"key": key}, context=CTX)
            memory.append(SCOPE, key + "#c", _user(key), context=CTX)
            return [memory.read(SCOPE, key, context=CTX).value,
                    memory.history(SCOPE, key + "#c", context=CTX).messages[-1]["content"]]
        return action

    cases = {f"key {name}": round_trip(key[:510]) for name, key in GOOD_KEYS.items()}
    outcomes, problems = _run_cases(pair, cases, dict.fromkeys(cases, "stored"))
    for name, key in GOOD_KEYS.items():
        if outcomes[f"key {name}"] != ("stored", [{"key": key[:510]}, key[:510]]):
            problems.append(f"key {name}: {outcomes[f'key {name}']!r:.80}")
    # NFC and NFD spellings are different keys on both backends
    for memory in pair.values():
        assert memory.read(SCOPE, "\u00e9", context=CTX).found is False
    figure(f"\nedge keys x 2 backends: {len(cases)} cases, {_tally(outcomes)}; "
          f"problems {len(problems)}")
    assert problems == []


@pytest.mark.parametrize("last", [-1, True, False, 1.5, "2", [1]])
def test_mem14_history_bad_last_is_invalid_input(pair: dict[str, Memory], last: Any,
        figure: Figure) -> None:
    name = f"history last={last!r}"
    outcomes, problems = _run_cases(
        pair, {name: lambda m: m.history(SCOPE, CONV, context=CTX, last=last).messages},
        {name: "refused"})
    figure(f"\n{name}: {outcomes[name]}; problems {len(problems)}")
    assert problems == []


# -- found as bugs, fixed: subclasses, huge ints, history cursors ----------------------------


@pytest.mark.parametrize("where", ["value", "content", "metadata"])
def test_mem14_int_beyond_str_digit_limit_is_consistent(pair: dict[str, Memory],
                                                        where: str, figure: Figure) -> None:
    huge = 10**5000
    action = {"value": _write({"n": huge}),
              "content": _append(_user(huge)),
              "metadata": _append(_user("x", metadata={"n": huge}))}[where]
    _, problems = _run_cases(pair, {f"10**5000 in {where}": action}, {})
    figure(f"\n10**5000 in {where}: problems {problems}")
    assert problems == []


@pytest.mark.parametrize("value", [_Color.RED, _Text("x")], ids=["IntEnum", "str-subclass"])
def test_mem7_subclasses_of_json_scalars_read_back_as_plain_json(
        pair: dict[str, Memory], value: Any, figure: Figure) -> None:
    _, problems = _run_cases(
        pair, {"value": _write({"v": value}), "content": _append(_user(value))}, {})
    figure(f"\n{type(value).__name__}: problems {problems}")
    assert problems == []


@pytest.mark.parametrize(("last", "before"), [(2, "x"), (2, 2**63), (2**63, None)],
                         ids=["before-str", "before-2**63", "last-2**63"])
def test_mem14_history_bad_cursor_is_a_typed_error_on_both_backends(
        pair: dict[str, Memory], last: Any, before: Any, figure: Figure) -> None:
    name = f"history last={last!r} before={before!r}"
    outcomes, problems = _run_cases(
        pair, {name: lambda m: m.history(SCOPE, CONV, context=CTX, last=last,
                                         before=before).messages}, {})
    figure(f"\n{name}: {outcomes[name]!r:.80}; problems {problems}")
    assert problems == []
