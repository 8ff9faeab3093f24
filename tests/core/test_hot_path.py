"""The append hot path's shortcuts keep every rule (#14).

- ``quick_init``: the frozen dataclasses built per append keep their exact
  signature, frozenness, equality and ``dataclasses.replace``.
- The coordinator reuses the last scope resolution only for the same frozen
  :class:`ExecutionContext`: a context object that can change is resolved
  again each time, and a refused scope is refused every time (MEM-6, MEM-7,
  MEM-13) however warm the reuse is.
- The memory store's MEM-12 lock is the stripe's lock even when the last
  key's lock is reused: a held key still makes an append fall back
  unserialized after the bounded wait.
- Without metrics ``Memory.append`` calls the store directly; with metrics it
  runs the generator protocol: both give the same results.
- A plan made on a partial hot copy, once the ids its new entries name that the copy
  does not know are learned, is the plan on the whole view.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import logging
import pickle
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from buffer_model import messages as buffer_messages
from flowmem import ExecutionContext, StorageKey
from flowmem._frozen import quick_init, quick_new
from flowmem.errors import KeyConflict
from flowmem.memory import Memory
from flowmem.messages import canonical_messages
from flowmem.metrics import Metrics
from flowmem.plan import SLOT, AddEntry, AppendPlan, BufferView, PendingCall, plan_append
from flowmem.plan._planner import plan_any, plan_one
from flowmem.store import AppendOutcome, AppendStats, HistoryPage, Idempotency
from flowmem.stores.memory import InMemoryStore
from flowmem.stores.sqlite._view_cache import HotBuffer


@dataclasses.dataclass(frozen=True, slots=True)
class _Plain:
    a: int
    b: list[int] = dataclasses.field(default_factory=list)
    c: bool = True


@quick_init
@dataclasses.dataclass(frozen=True, slots=True)
class _Quick:
    a: int
    b: list[int] = dataclasses.field(default_factory=list)
    c: bool = True


def test_quick_init_keeps_the_dataclass_signature_and_behaviour() -> None:
    assert str(inspect.signature(_Quick)) == str(inspect.signature(_Plain))
    first, second = _Quick(1), _Quick(1)
    assert first.b == [] and first.b is not second.b  # a fresh default per instance
    assert _Quick(1, [2], c=False) == _Quick(a=1, b=[2], c=False)
    assert dataclasses.replace(first, a=3) == _Quick(3)
    assert repr(_Quick(1)) == "_Quick(a=1, b=[], c=True)"
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.a = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        _Quick()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _Quick(1, [], True, 4)  # type: ignore[call-arg]


@pytest.mark.parametrize("cls", [AddEntry, AppendPlan, PendingCall, AppendOutcome, AppendStats,
                                 HistoryPage, Idempotency, StorageKey])
def test_hot_dataclasses_keep_their_fields_and_stay_frozen(cls: type[Any]) -> None:
    params = list(inspect.signature(cls).parameters.values())
    assert [p.name for p in params] == [f.name for f in dataclasses.fields(cls)]
    args = {p.name: 0 for p in params if p.default is inspect.Parameter.empty}
    made = cls(**args)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, params[0].name, 1)


def test_append_outcome_as_other_stores_build_it() -> None:
    stats = AppendStats(1, 0, 2, 0)
    outcome = AppendOutcome(5, 1, False, stats, True)
    assert (outcome.count, outcome.appended, outcome.serialized, outcome.stats,
            outcome.replayed) == (5, 1, False, stats, True)
    assert AppendOutcome(5, 1) == AppendOutcome(5, 1, True, AppendStats(), False)


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def test_a_changing_context_object_is_resolved_again_each_time() -> None:
    memory = Memory(InMemoryStore())
    context = SimpleNamespace(user_id=None, session_id="s1", workflow_id=None,
                              pipeline_id=None, execution_id=None, node_id=None)
    first = memory.append("session", "k", _user("a"), context=context)  # type: ignore[arg-type]
    context.session_id = "s2"
    second = memory.append("session", "k", _user("b"), context=context)  # type: ignore[arg-type]
    assert (first.resolved_scope_id, second.resolved_scope_id) == ("s1", "s2")
    assert (first.count, second.count) == (1, 1)


def test_mem7_refusal_is_decided_every_time_after_a_warm_resolution(
        caplog: pytest.LogCaptureFixture) -> None:
    """MEM-6/MEM-7: a refused context right after a resolved one is refused, logged once."""
    memory = Memory(InMemoryStore())
    good = ExecutionContext(user_id="u1", node_id="n1")
    for text in ("a", "b"):
        assert memory.append("user", "k", _user(text), context=good).resolved_scope_id == "u1"
    for bad in (ExecutionContext(user_id="0", node_id="n2"), None,
                ExecutionContext(user_id=True, node_id="n3")):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="flowmem"):
            refused = memory.append("user", "k", _user("c"), context=bad)
        assert refused.refused and refused.resolved_scope_id == "" and refused.count == 0
        assert len(caplog.records) == 1
    assert memory.read("user", "k", context=good).value == [
        {"role": "user", "content": t, "metadata": {}} for t in ("a", "b")]


def test_the_same_context_with_another_key_or_scope_is_another_place() -> None:
    memory = Memory(InMemoryStore())
    context = ExecutionContext(user_id="u1", session_id="s1")
    memory.append("user", "k", _user("a"), context=context)
    other_key = memory.append("user", "k2", _user("b"), context=context)
    other_scope = memory.append("session", "k", _user("c"), context=context)
    assert other_key.count == 1 and other_scope.count == 1
    assert other_scope.resolved_scope_id == "s1"
    with pytest.raises(ValueError):
        memory.append("user", "", _user("d"), context=context)


def test_mem12_a_held_key_still_falls_back_after_the_last_lock_was_reused() -> None:
    store = InMemoryStore()
    memory = Memory(store, lock_timeout=0.05)
    context = ExecutionContext(session_id="s")
    assert memory.append("session", "k", _user("a"), context=context).serialized
    assert memory.append("session", "k", _user("b"), context=context).serialized
    where = StorageKey("session", "s", "k")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store.lock(where, 1.0) as had:
            assert had
            held.set()
            release.wait(5.0)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(5.0)
        late = memory.append("session", "k", _user("c"), context=context)
    finally:
        release.set()
        holder.join()
    assert not late.serialized and late.count == 3  # MEM-12: made whole, unserialized
    assert memory.append("session", "k", _user("d"), context=context).serialized


def test_the_direct_call_and_the_metrics_path_give_the_same_results() -> None:
    plain, timed = Memory(InMemoryStore()), Memory(InMemoryStore(), metrics=Metrics())
    context = ExecutionContext(session_id="s")
    turns: list[Any] = [
        _user("q"),
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
        {"role": "tool", "tool_call_id": "c1", "content": "again"},  # MEM-1: dropped
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c2", "type": "function",
                                                                "function": {"name": "f"}}]},
        _user("next"),  # MEM-3: heals c2
        {"role": "tool", "tool_call_id": "c2", "content": "late"},  # MEM-10: replaces
    ]
    for turn in turns:
        a = plain.append("session", "k", turn, context=context, max_messages=6)
        b = timed.append("session", "k", turn, context=context, max_messages=6)
        assert (a.count, a.appended, a.serialized, a.replayed, a.messages) == (
            b.count, b.appended, b.serialized, b.replayed, b.messages)
    again = plain.append("session", "k", _user("x"), context=context, idempotency_key="i1")
    replay = plain.append("session", "k", _user("x"), context=context, idempotency_key="i1")
    assert replay.replayed and (replay.count, replay.appended) == (again.count, again.appended)


# -- quick_new: the factories of the per-append dataclasses ---------------------------------
@pytest.mark.parametrize("cls", [AddEntry, AppendPlan, PendingCall, AppendOutcome, AppendStats])
def test_quick_new_builds_the_same_frozen_instance_as_the_constructor(cls: type[Any]) -> None:
    new = quick_new(cls)
    assert [p.name for p in inspect.signature(new).parameters.values()] == [
        f.name for f in dataclasses.fields(cls)]
    args = [i for i, f in enumerate(dataclasses.fields(cls))
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    made, built = new(*args), cls(*args)
    assert type(made) is cls and made == built and repr(made) == repr(built)
    assert hash(made) == hash(built)
    assert copy.deepcopy(made) == built and pickle.loads(pickle.dumps(made)) == built
    assert dataclasses.replace(made) == built
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, dataclasses.fields(cls)[0].name, 1)


def test_quick_new_gives_a_fresh_default_and_refuses_what_it_cannot_build() -> None:
    new = quick_new(_Quick)
    assert new(1).b == [] and new(1).b is not new(1).b
    assert new(1, [2], False) == _Quick(1, [2], False)
    with pytest.raises(TypeError):
        new()  # type: ignore[call-arg]

    class Loose:
        __slots__ = ("a",)

    @dataclasses.dataclass(frozen=True)
    class Unslotted:
        a: int

    for cls in (Loose, Unslotted):
        with pytest.raises(TypeError):
            quick_new(cls)


# -- the planner's short path for one message (MEM-1, 2, 3, 10, 11) -------------------------
_IDS = ["c0", "c1", "c2", "c3", "7"]  # the ids of test_buffer_properties' messages, but c4
_pending = st.builds(PendingCall, st.sampled_from(_IDS),
                     st.integers(0, 9).map(lambda p: p * SLOT), st.integers(0, 2))
_views = st.builds(
    BufferView,
    st.dictionaries(st.sampled_from(_IDS), st.booleans(), max_size=5),
    st.frozensets(st.sampled_from(_IDS), max_size=5),
    st.lists(_pending, max_size=3, unique_by=lambda p: p.call_id),
)


@given(view=_views, message=buffer_messages)
@settings(max_examples=400, deadline=None)
def test_the_one_message_plan_is_the_planners(view: BufferView, message: dict[str, Any]) -> None:
    """The short path decides a one-message append exactly as the planner does."""
    canonical = canonical_messages(message)
    assert plan_append(view, canonical) == plan_any(view, canonical)


@given(view=_views, known=st.frozensets(st.sampled_from(_IDS)),
       incoming=st.lists(buffer_messages, min_size=1, max_size=4))
@settings(max_examples=400, deadline=None)
def test_a_plan_on_a_partial_copy_is_the_plan_once_its_unknown_ids_are_learned(
        view: BufferView, known: frozenset[str], incoming: list[dict[str, Any]]) -> None:
    """#14: the SQLite fast path plans on a partial copy first and learns only the ids
    the plan's new entries answer or declare that the copy does not know
    (``HotBuffer.unknown_in``), planning again only when one of them turns out held.
    Whatever the copy knows, the plan it keeps is the plan on the whole view: MEM-1
    duplicates, MEM-2 declarations, MEM-3 heals and MEM-10 replacements decided as if
    every id had been read."""
    pending = {p.call_id: p for p in view.pending}
    results = {i: held for i, held in view.results.items() if i not in pending}
    declared = set(view.declared) | set(pending)  # a real view's: every unanswered call
    whole = BufferView(results, frozenset(declared), list(pending.values()))
    facts = set(known) | set(pending)  # a copy knows its unanswered calls' facts
    copy = HotBuffer(1, 0, 0, {i: h for i, h in results.items() if i in facts},
                     declared & facts, dict(pending), known=set(facts))
    canonical = canonical_messages(incoming)
    planned = plan_append(copy.view(), canonical)
    unknown = copy.unknown_in(planned)
    if unknown:  # as sqlite_fast.run_append: learn once, plan again only if one is held
        copy.learn(unknown, {i: results[i] for i in unknown if i in results},
                   {i for i in unknown if i in declared})
        if copy.holds_any(unknown):
            planned = plan_append(copy.view(), canonical)
            assert copy.unknown_in(planned) == []  # one round learns them all
    assert planned == plan_append(whole, canonical)


@pytest.mark.parametrize("message", [
    {"role": "user", "content": "q"},
    {"role": "system", "content": "s"},
    {"role": "assistant", "content": "a"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c9", "type": "function"}]},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]},
    {"role": "tool", "tool_call_id": "c9", "content": "r"},
    {"role": "tool", "tool_call_id": "0", "content": "r"},  # an unusable id (MEM-11)
])
def test_the_common_one_message_appends_take_the_short_path(message: dict[str, Any]) -> None:
    view = BufferView({"c1": False}, frozenset({"c1"}), ())
    assert plan_one(view, canonical_messages(message)[0]) is not None


@pytest.mark.parametrize("message", [
    {"role": "tool", "tool_call_id": "c1", "content": "again"},  # MEM-1: a duplicate
    {"role": "tool", "tool_call_id": "c2", "content": "late"},  # MEM-10: replaces
    {"role": "user", "content": "next"},  # MEM-3: heals c3
])
def test_the_rest_goes_through_the_planner(message: dict[str, Any]) -> None:
    view = BufferView({"c1": False, "c2": True}, frozenset({"c1", "c2", "c3"}),
                      [PendingCall("c3", 0, 0)])
    assert plan_one(view, canonical_messages(message)[0]) is None


def test_the_memory_store_forgets_its_last_buffer_when_the_key_is_replaced() -> None:
    """Writing or deleting the key an append used last never leaves appends to the old buffer."""
    memory = Memory(InMemoryStore())
    context = ExecutionContext(session_id="s")
    memory.append("session", "k", _user("a"), context=context)
    memory.delete("session", "k", context=context)
    assert memory.append("session", "k", _user("b"), context=context).count == 1
    memory.write("session", "k", 1, context=context, replace=True)
    with pytest.raises(KeyConflict):
        memory.append("session", "k", _user("c"), context=context)
    memory.delete("session", "k", context=context)
    assert memory.append("session", "k", _user("d"), context=context).count == 1
    assert memory.read("session", "k", context=context).value == [
        {"role": "user", "content": "d", "metadata": {}}]
