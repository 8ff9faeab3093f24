"""The model-based test: a store equals the pure :func:`flowmem.append` after every step.

A Hypothesis state machine drives a store and a plain list through the same
random appends — user turns, assistant turns declaring ids from a small pool
in either spelling, re-fired and late results, incoming healed messages,
system messages, multi-message batches, a window — and after every step
checks the store's buffer, ``count`` and ``appended`` against the model. For
a persistent store it also closes and reopens the store mid-sequence, with a few
appends between two reopenings.

It runs under both call-id policies (:mod:`flowmem.call_ids`): ``strict``
against :func:`flowmem.append`, ``per_turn`` (the turns reuse ids with other
arguments) against a :class:`~flowmem.ConversationBuffer` under that policy, the
stored ids compared as stored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from ..buffer import AppendResult, ConversationBuffer
from ..buffer import append as model_append
from ..call_ids import CallIds, PerTurn
from ..messages import Message, canonical_messages
from ..store import Store
from .contract import fresh_key

__all__ = ["StoreModelMachine", "store_model_test"]

_IDS = st.sampled_from(["c0", "c1", "c2", "c3", "c4", "c5"])
_SPELLING = st.sampled_from(["id", "tool_call_id"])
_ARGUMENTS = st.sampled_from(["{}", "{}", '{"n": 1}'])
_REOPEN_SPACING = 5
"""Appends between two reopenings (the rule is a no-op until then, as it is for a store
that keeps nothing): opening a store (a pool, a cluster's slots) costs many appends'
time, and a reopening with little new to read adds little."""


@st.composite
def _message(draw: st.DrawFn) -> Message:
    kind = draw(st.sampled_from(["user", "assistant", "tool", "tool", "healed", "system",
                                 "chat"]))
    if kind == "user":
        return {"role": "user", "content": draw(st.sampled_from(["hi", "next", "\u0000?"]))}
    if kind == "system":
        return {"role": "system", "content": "sys"}
    if kind == "chat":
        return {"role": "assistant", "content": "plain answer"}
    if kind == "assistant":
        ids = draw(st.lists(_IDS, min_size=1, max_size=3))
        calls = [{draw(_SPELLING): i, "type": "function",
                  "function": {"name": "f", "arguments": draw(_ARGUMENTS)}} for i in ids]
        where = draw(st.booleans())
        if where:
            return {"role": "assistant", "content": None, "tool_calls": calls}
        return {"role": "assistant", "content": "", "metadata": {"tool_calls": calls}}
    message: Message = {"role": "tool", "tool_call_id": draw(_IDS),
                        "content": draw(st.sampled_from(["r1", "r2"]))}
    if kind == "healed":
        message["metadata"] = {"healed": True}
    return message


class StoreModelMachine(RuleBasedStateMachine):
    """Subclass with ``open_store`` set (see :func:`store_model_test`)."""

    open_store: ClassVar[Callable[[], Store]]
    reopenable: ClassVar[bool] = False
    call_ids: ClassVar[CallIds] = "strict"

    def __init__(self) -> None:
        super().__init__()
        self.store = type(self).open_store()
        self.key = fresh_key()
        self.model: list[Message] = []
        self.window: int | None = None
        self.per_turn: ConversationBuffer | None = None
        self.since_reopen = _REOPEN_SPACING  # a first reopening may come at once

    @initialize(window=st.none() | st.integers(min_value=1, max_value=8))
    def choose_window(self, window: int | None) -> None:
        self.window = window
        if type(self).call_ids == "per_turn":
            self.per_turn = ConversationBuffer(max_messages=window, call_ids="per_turn")

    @rule(batch=st.lists(_message(), min_size=1, max_size=4),
          tail=st.sampled_from([0, 0, 1, 3]))
    def append(self, batch: list[Message], tail: int = 0) -> None:
        incoming = canonical_messages(batch)
        if self.per_turn is None:
            expected: AppendResult = model_append(self.model, batch, max_messages=self.window)
        else:
            expected = self.per_turn.append(batch)
            incoming = PerTurn(incoming)
        outcome = self.store.append(self.key, incoming,
                                    max_messages=self.window, lock_timeout=5.0, tail=tail)
        assert (outcome.count, outcome.appended) == (expected.count, expected.appended), (
            f"store {outcome} != model {expected}")
        self.model = expected.messages
        self.since_reopen += 1
        if tail:  # the newest entries the append left, read in its own unit
            assert outcome.tail is not None and outcome.tail.messages == self.model[-tail:]
            assert outcome.tail.total == len(self.model)
        else:
            assert outcome.tail is None

    @rule(message=_message())
    def append_twice(self, message: Message) -> None:
        self.append([message])
        self.append([message])

    @rule()
    def reopen(self) -> None:
        if type(self).reopenable and self.since_reopen >= _REOPEN_SPACING:
            self.store.close()
            self.store = type(self).open_store()
            self.since_reopen = 0

    @invariant()
    def store_equals_model(self) -> None:
        found, value = self.store.read(self.key)
        stored: Any = value if found else []
        assert stored == self.model
        page = self.store.history(self.key, last=3)
        assert page.messages == self.model[-3:]

    def teardown(self) -> None:
        self.store.close()


def store_model_test(open_store: Callable[[], Store], *, reopenable: bool = False,
                     max_examples: int = 40, steps: int = 25) -> None:
    """Run :class:`StoreModelMachine` against stores made by ``open_store``, under each
    call-id policy (``per_turn`` with half the examples).

    ``reopenable``: the store keeps its data across instances (reopened
    mid-sequence). Each run works under a fresh key, so the stores may share
    one database.
    """
    policies: list[tuple[CallIds, int]] = [("strict", max_examples),
                                           ("per_turn", max(1, max_examples // 2))]
    for call_ids, examples in policies:
        machine = type("Machine", (StoreModelMachine,),
                       {"open_store": staticmethod(open_store), "reopenable": reopenable,
                        "call_ids": call_ids})
        run_state_machine_as_test(machine, settings=settings(  # type: ignore[no-untyped-call, unused-ignore]
            max_examples=examples, stateful_step_count=steps, deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]))
