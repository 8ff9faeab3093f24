"""The SQLite store's short path of a hot append (#14, :mod:`flowmem.stores.sqlite._append`):
it runs exactly the statements of the SQL program (same text, parameters and order) and
leaves the same conversation, outcome, tail and hot copy, whatever the append — the rules
stay decided by the planner (MEM-1, MEM-2, MEM-3, MEM-10, MEM-14, the window)."""

from __future__ import annotations

import random
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowmem.errors import KeyConflict
from flowmem.messages import Message, canonical_messages
from flowmem.scopes import StorageKey
from flowmem.store import AppendOutcome
from flowmem.stores.sqlite._group_commit import AppendRequest
from flowmem.stores.sqlite._store import SQLiteStore
from flowmem.stores.sqlite._view_cache import TAIL_KEEP
from flowmem.testing.contract import assistant, tool, user

KEYS = (StorageKey("session", "s1", "chat"), StorageKey("session", "s2", "chat"))
RECORD = StorageKey("session", "s1", "record")  # a plain value beside the conversations
_IDS = st.sampled_from(["c0", "c1", "c2", "c3", "c4"])


@st.composite
def _message(draw: st.DrawFn) -> Message:
    """Workload-like messages: turns, tool calls and their results, re-fired (MEM-1) and
    late results, healed ones (MEM-10), interrupted calls healed by a user turn (MEM-3)."""
    kind = draw(st.sampled_from(["user", "calls", "calls", "result", "result", "result",
                                 "healed", "answer", "system"]))
    if kind == "user":
        return user(draw(st.sampled_from(["hi", "next", "\u00e9t\u00e9 \u0000"])))
    if kind == "calls":
        return assistant(*draw(st.lists(_IDS, min_size=1, max_size=3, unique=True)),
                         spelling=draw(st.sampled_from(["id", "tool_call_id"])))
    if kind in ("result", "healed"):
        return tool(draw(_IDS), draw(st.sampled_from(["ok", "late"])), healed=kind == "healed")
    if kind == "answer":
        return {"role": "assistant", "content": "done"}
    return {"role": "system", "content": "sys"}


_APPEND = st.tuples(st.just("append"), st.integers(0, 1),
                    st.one_of(st.lists(_message(), min_size=1, max_size=1),
                              st.lists(_message(), min_size=2, max_size=3)),
                    st.sampled_from([None, None, None, 3, 6]), st.sampled_from([0, 0, 1, 2, 5]))
_FOREIGN = st.tuples(st.just("foreign"), st.integers(0, 1), st.lists(_message(), min_size=1,
                                                                     max_size=2))
_STEP = st.one_of(
    _APPEND, _APPEND, _APPEND, _APPEND, _FOREIGN,
    st.tuples(st.just("group"), st.lists(_APPEND, min_size=1, max_size=3)),
    st.tuples(st.just("write"), st.sampled_from([RECORD, KEYS[1]])),
)


class Side:
    """One store (short path on or off) on its own file, with another connection to the
    same file whose commits are foreign to the store's hot copies."""

    def __init__(self, path: Path, short: bool) -> None:
        self.store = SQLiteStore(str(path), synchronous="off")
        self.store.short_appends = short
        self.other = SQLiteStore(str(path), synchronous="off")
        self.ran: list[str] = []
        self.store._connection().set_trace_callback(self.ran.append)

    @contextmanager
    def seeded(self, seed: int) -> Iterator[None]:
        """The same versions drawn on both sides (they are parameters of the statements)."""
        state = random.getstate()
        random.seed(seed)
        try:
            yield
        finally:
            random.setstate(state)

    def step(self, seed: int, step: tuple[Any, ...]) -> Any:
        with self.seeded(seed):
            try:
                return self._step(step)
            except Exception as exc:  # a rule refused it: the same one on both sides
                return type(exc).__name__

    def _step(self, step: tuple[Any, ...]) -> Any:
        if step[0] == "append":
            _, key, batch, window, tail = step
            return self.store.append(KEYS[key], canonical_messages(batch), max_messages=window,
                                     lock_timeout=5.0, tail=tail)
        if step[0] == "foreign":
            return self.other.append(KEYS[step[1]], canonical_messages(step[2]),
                                     max_messages=None, lock_timeout=5.0)
        if step[0] == "group":
            return [a if isinstance(a, AppendOutcome) else type(a).__name__
                    for a in self.store.append_group([_request(s) for s in step[1]])]
        self.store.write(step[1], {"status": "idle"})
        return None

    def state(self) -> tuple[Any, ...]:
        """The conversations, and the hot copies of this connection."""
        hot = self.store._programs().hot
        assert hot is not None
        return (tuple(self.store.read(key) for key in (*KEYS, RECORD)),
                tuple(hot.get((key.scope, key.scope_id, key.key)) for key in KEYS))

    def close(self) -> None:
        self.store.close()
        self.other.close()


def _request(step: tuple[Any, ...]) -> AppendRequest:
    _, key, batch, window, tail = step
    return AppendRequest(KEYS[key], canonical_messages(batch), window, 5.0, tail=tail)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(_STEP, min_size=1, max_size=30))
def test_the_short_path_runs_the_programs_statements(steps: list[tuple[Any, ...]]) -> None:
    """Random append sequences through two stores, the short path on and off: after each
    step the traced statements, the outcomes (tails included), the conversations and the
    hot copies (version, tail deque, unanswered calls) are the same."""
    _compare(steps)


# the common append, mostly: one message, no window, a tail now and then
_QUIET = st.tuples(st.just("append"), st.integers(0, 1), st.lists(_message(), min_size=1,
                                                                   max_size=1),
                   st.just(None), st.sampled_from([0, 0, 0, 2]))
_QUIET_STEP = st.one_of(_QUIET, _QUIET, _QUIET, _QUIET, _QUIET, _APPEND, _FOREIGN)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(_QUIET_STEP, min_size=1, max_size=40))
def test_the_common_append_runs_the_programs_statements(
        steps: list[tuple[Any, ...]]) -> None:
    """The same comparison on longer runs of the common append (one message, no window),
    where most appends take :func:`~flowmem.stores.sqlite._append._apply_one` and foreign
    commits make the copies check their versions (or go stale)."""
    _compare(steps)


def _compare(steps: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory() as workdir:
        short, program = Side(Path(workdir, "short.db"), True), Side(Path(workdir, "p.db"), False)
        try:
            for n, step in enumerate(steps):
                answers = short.step(n, step), program.step(n, step)
                assert answers[0] == answers[1], step
                assert short.ran == program.ran, step
                assert short.state() == program.state(), step
                short.ran.clear()
                program.ran.clear()
        finally:
            short.close()
            program.close()


def _append(store: SQLiteStore, message: Message, tail: int = 0) -> AppendOutcome:
    return store.append(KEYS[0], canonical_messages([message]), max_messages=None,
                        lock_timeout=5.0, tail=tail)


def _programs_run(store: SQLiteStore,
                  monkeypatch: pytest.MonkeyPatch) -> list[Sequence[Message]]:
    """The appends ``store`` runs as the SQL program from now on (the short path runs none)."""
    programs = store._programs()
    real = programs.append
    ran: list[Sequence[Message]] = []

    def spy(key: StorageKey, incoming: Sequence[Message], *args: Any, **options: Any) -> Any:
        ran.append(incoming)
        return real(key, incoming, *args, **options)

    monkeypatch.setattr(programs, "append", spy)
    return ran


def test_a_hot_quiet_append_runs_no_program(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The common append (hot copy current, only adds, no window, no idempotency key) is
    the short path; a user turn that heals (MEM-3) still runs the program."""
    store = SQLiteStore(str(tmp_path / "s.db"), synchronous="off")
    _append(store, user("first"))  # a buffer this connection creates is hot at once
    ran = _programs_run(store, monkeypatch)
    for message in (assistant("c1", "c2"), tool("c1"), {"role": "assistant", "content": "x"}):
        assert _append(store, message).appended == 1
    assert ran == []
    assert _append(store, user("next")).stats.healed == 1  # c2 (MEM-3)
    assert len(ran) == 1
    store.close()


def test_a_partial_copy_learns_a_new_id_on_the_short_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection whose copy of a conversation is partial (another one wrote it) reads the
    view of an id it does not know (by id: never the whole conversation) and stays on the
    short path; the facts come from the database, so a result the other connection stored
    is not stored twice (MEM-1)."""
    path = str(tmp_path / "p.db")
    writer = SQLiteStore(path, synchronous="off")
    for message in (user("first"), assistant("c1"), tool("c1")):
        _append(writer, message)
    store = SQLiteStore(path, synchronous="off")
    _append(store, {"role": "assistant", "content": "x"})  # starts a partial copy
    programs = store._programs()
    buffer = programs.hot.get(("session", "s1", "chat")) if programs.hot else None
    assert buffer is not None and buffer.known is not None
    ran = _programs_run(store, monkeypatch)
    assert _append(store, assistant("c2")).appended == 1  # an id the copy did not know
    assert buffer.known is not None and "c2" in buffer.known  # its view read
    assert _append(store, tool("c1", "again")).appended == 0  # MEM-1: stored by the writer
    assert buffer.known is not None and "c1" in buffer.known
    assert _append(store, assistant("c3")).appended == 1
    assert buffer.known is not None and "c3" in buffer.known  # still partial: learned by id
    assert _append(store, tool("c2")).appended == 1
    assert ran == []
    assert [m["role"] for m in store.read(KEYS[0])[1]] == [
        "user", "assistant", "tool", "assistant", "assistant", "assistant", "tool"]
    store.close()
    writer.close()


@pytest.mark.parametrize("short", [True, False])
def test_a_tail_longer_than_the_kept_one_is_read(tmp_path: Path, short: bool) -> None:
    """A hot copy holding its whole buffer of TAIL_KEEP entries does not hold a longer tail
    once the append pushed its oldest entry out: the tail is read, never refused (both
    paths: the condition is HotBuffer.serves)."""
    store = SQLiteStore(str(tmp_path / "t.db"), synchronous="off")
    store.short_appends = short
    for n in range(TAIL_KEEP - 1):
        _append(store, user(str(n)))
    assert _append(store, user("x"), tail=TAIL_KEEP + 50).count == TAIL_KEEP  # learns it
    outcome = _append(store, user("y"), tail=TAIL_KEEP + 50)
    assert outcome.tail is not None and outcome.tail == store.history(KEYS[0],
                                                                      last=TAIL_KEEP + 50)
    assert outcome.tail.total == TAIL_KEEP + 1
    store.close()


def test_a_refused_append_in_a_group_fails_alone(tmp_path: Path) -> None:
    """In a group, a short append beside one a rule refuses (KeyConflict: the key holds a
    value) commits; the refused one rolls back to its savepoint and its copy with it."""
    store = SQLiteStore(str(tmp_path / "g.db"), synchronous="off")
    _append(store, user("first"))
    store.write(RECORD, {"plain": True})
    answers = store.append_group([
        AppendRequest(KEYS[0], canonical_messages([assistant("c1")]), None, 5.0),
        AppendRequest(RECORD, canonical_messages([user("no")]), None, 5.0),
        AppendRequest(KEYS[0], canonical_messages([tool("c1")]), None, 5.0, tail=3)])
    assert isinstance(answers[1], KeyConflict)
    assert [a.count for a in answers if isinstance(a, AppendOutcome)] == [2, 3]
    last = answers[2]
    assert isinstance(last, AppendOutcome) and last.tail == store.history(KEYS[0], last=3)
    store.close()
