"""MEM-6, MEM-7, MEM-13 through the coordinator, and opening a Memory from a URL.

A refusal is decided in ONE place (``Memory``): under a refused ``user`` or
``session`` scope every method returns its neutral result with
``resolved_scope_id == ""``, the store is never called (a spy store records
every call), and exactly one warning naming the node, pipeline and workflow
is logged on the ``flowmem`` logger. Identity scopes never fall back to the
shared bucket, and different identities never see each other's buckets.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from figures import Figure
from flowmem import (
    ExecutionContext,
    FlowmemError,
    InvalidStoreURL,
    StorageKey,
    StoreError,
    UnknownScope,
)
from flowmem.memory import Memory
from flowmem.stores.memory import InMemoryStore
from flowmem.stores.sqlite._store import SQLiteStore

NODE, PIPELINE, WORKFLOW = "node-7f", "pipe-3c", "wf-9a"


class SpyStore:
    """A real :class:`InMemoryStore` that records every call made to it."""

    def __init__(self) -> None:
        self.inner = InMemoryStore()
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            self.calls.append((name, (), {}))
            return attr

        def recorded(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args, kwargs))
            return attr(*args, **kwargs)

        return recorded

    def keys_touched(self) -> list[StorageKey]:
        return [args[0] for _, args, _ in self.calls if args and isinstance(args[0], StorageKey)]


def _ctx(**ids: Any) -> ExecutionContext:
    return ExecutionContext(node_id=NODE, pipeline_id=PIPELINE, workflow_id=WORKFLOW, **ids)


UNUSABLE: list[Any] = [None, "", "   ", "\t\n", 0, "0", " 0 ", True, False, 1.5,
                       ["u1"], {"id": "u1"}, b"u1", "u\x00 1", "\ud800"]


def _refusing_contexts(field: str) -> list[ExecutionContext | None]:
    """Contexts under which ``user`` (field ``user_id``) or ``session`` is refused."""
    others = {"user_id": "u-real", "session_id": "s-real"}
    contexts: list[ExecutionContext | None] = [None]
    for bad in UNUSABLE:
        ids = dict(others)
        ids[field] = bad
        contexts.append(_ctx(**ids))
    return contexts


Operation = Callable[[Memory, str, ExecutionContext | None], Any]


def _read(m: Memory, scope: str, ctx: ExecutionContext | None) -> Any:
    return m.read(scope, "k", context=ctx, default={"sentinel": 1})


def _write(m: Memory, scope: str, ctx: ExecutionContext | None) -> Any:
    return m.write(scope, "k", {"v": 1}, context=ctx)


def _delete(m: Memory, scope: str, ctx: ExecutionContext | None) -> Any:
    return m.delete(scope, "k", context=ctx)


def _append(m: Memory, scope: str, ctx: ExecutionContext | None) -> Any:
    return m.append(scope, "k", [{"role": "user", "content": "hi"}], context=ctx,
                    max_messages=10)


def _history(m: Memory, scope: str, ctx: ExecutionContext | None) -> Any:
    return m.history(scope, "k", context=ctx, last=5)


OPERATIONS: dict[str, Operation] = {
    "read": _read, "write": _write, "delete": _delete, "append": _append, "history": _history,
}


def _check_neutral(name: str, result: Any, scope: str) -> None:
    assert result.scope == scope
    assert result.resolved_scope_id == ""
    assert result.refused is True
    if name == "read":
        assert result.value == {"sentinel": 1} and result.found is False
    elif name in ("write", "delete"):
        assert result.ok is False
        if name == "delete":
            assert result.found is False
    elif name == "append":
        assert result.messages == [] and result.count == 0 and result.appended == 0
        assert result.appended_any is False
    else:
        assert result.messages == [] and result.positions == [] and result.before is None


def _flowmem_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "flowmem" and r.levelno == logging.WARNING]


@pytest.mark.parametrize(("scope", "field"), [("user", "user_id"), ("session", "session_id")],
                         ids=["MEM-6-user", "MEM-13-session"])
def test_mem6_mem7_mem13_refusal_is_neutral_reaches_no_backend_and_warns_once(
        scope: str, field: str, caplog: pytest.LogCaptureFixture, figure: Figure) -> None:
    spy = SpyStore()
    memory = Memory(spy)  # type: ignore[arg-type]
    refusals = 0
    for ctx in _refusing_contexts(field):
        for name, operation in OPERATIONS.items():
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="flowmem"):
                result = operation(memory, scope, ctx)
            _check_neutral(name, result, scope)
            warnings = _flowmem_warnings(caplog)
            assert len(warnings) == 1, (name, ctx, [w.getMessage() for w in warnings])
            text = warnings[0].getMessage()
            if ctx is not None:
                for named in (NODE, PIPELINE, WORKFLOW):
                    assert named in text, (named, text)
            refusals += 1
    figure(f"\nMEM-7 {scope}: {refusals} refusals "
          f"({len(_refusing_contexts(field))} contexts x {len(OPERATIONS)} operations), "
          f"backend calls {len(spy.calls)}, warnings 1 each")
    assert spy.calls == []
    assert refusals == len(_refusing_contexts(field)) * len(OPERATIONS)


def test_mem7_refusal_happens_before_any_backend_even_with_data_present(
        caplog: pytest.LogCaptureFixture, figure: Figure) -> None:
    """The shared bucket holds data under the same key; a refusal still sees nothing."""
    spy = SpyStore()
    memory = Memory(spy)  # type: ignore[arg-type]
    shared = StorageKey("user", "", "k")
    spy.inner.write(shared, "shared-bucket")
    spy.inner.append(StorageKey("session", "", "k"), [{"role": "user", "content": "x",
                                                       "metadata": {}}],
                     max_messages=None, lock_timeout=1.0)
    with caplog.at_level(logging.WARNING, logger="flowmem"):
        read = memory.read("user", "k", context=_ctx(user_id="0"))
        page = memory.history("session", "k", context=_ctx(session_id=" "))
    figure(f"\nMEM-7 with data in the '' bucket: read found={read.found}, "
          f"history={len(page.messages)} messages, backend calls {len(spy.calls)}")
    assert (read.value, read.found) == (None, False)
    assert page.messages == []
    assert spy.calls == []
    assert len(_flowmem_warnings(caplog)) == 2


def test_mem7_unknown_scope_is_a_typed_error_not_a_refusal(
        caplog: pytest.LogCaptureFixture, figure: Figure) -> None:
    spy = SpyStore()
    memory = Memory(spy)  # type: ignore[arg-type]
    raised = 0
    with caplog.at_level(logging.WARNING, logger="flowmem"):
        for bad in ("users", "", "GLOBAL", "tenant", None, 3):
            for name, operation in OPERATIONS.items():
                with pytest.raises(UnknownScope) as info:
                    operation(memory, bad, _ctx(user_id="u1", session_id="s1"))
                assert isinstance(info.value, FlowmemError)
                assert isinstance(info.value, ValueError), name
                raised += 1
    figure(f"\nMEM-7 unknown scopes: {raised} UnknownScope raised, "
          f"warnings {len(_flowmem_warnings(caplog))}, backend calls {len(spy.calls)}")
    assert raised == 30
    assert _flowmem_warnings(caplog) == []
    assert spy.calls == []


def test_mem6_mem13_usable_identity_reaches_the_store_under_its_own_id(
        caplog: pytest.LogCaptureFixture, figure: Figure) -> None:
    spy = SpyStore()
    memory = Memory(spy)  # type: ignore[arg-type]
    ctx = _ctx(user_id=" 42 ", session_id=7)
    with caplog.at_level(logging.WARNING, logger="flowmem"):
        wrote = memory.write("user", "k", "mine", context=ctx)
        appended = memory.append("session", "k", {"role": "user", "content": "hi"}, context=ctx)
    touched = {(k.scope, k.scope_id) for k in spy.keys_touched()}
    figure(f"\nMEM-6/13 usable ids: user -> {wrote.resolved_scope_id!r}, "
          f"session -> {appended.resolved_scope_id!r}, keys touched {sorted(touched)}")
    assert (wrote.ok, wrote.resolved_scope_id, wrote.refused) == (True, "42", False)
    assert appended.refused is False
    assert (appended.count, appended.appended, appended.resolved_scope_id) == (1, 1, "7")
    assert touched == {("user", "42"), ("session", "7")}
    assert _flowmem_warnings(caplog) == []


# -- isolation of buckets, on every embedded backend -----------------------------------


@pytest.fixture(params=["memory", "sqlite"])
def memory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Memory]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'iso.db'}"
    with Memory.from_url(url) as opened:
        yield opened


def test_mem6_mem13_identity_scopes_never_fall_back_to_the_shared_bucket(
        memory: Memory, figure: Figure) -> None:
    # Something sits in the '' bucket of every scope first.
    for scope in ("workflow", "pipeline", "execution"):
        memory.write(scope, "k", f"shared-{scope}", context=ExecutionContext())
        memory.append(scope, "conv", {"role": "user", "content": f"shared-{scope}"},
                      context=ExecutionContext())
    assert memory.read("global", "k", context=None).found is False
    leaks = 0
    for scope, field in (("user", "user_id"), ("session", "session_id")):
        for ctx in _refusing_contexts(field):
            assert memory.write(scope, "k", "x", context=ctx).ok is False
            assert memory.append(scope, "conv", {"role": "user", "content": "x"},
                                 context=ctx).count == 0
            leaks += memory.read(scope, "k", context=ctx).found
            leaks += memory.read(scope, "conv", context=ctx).found
    # Nothing was written anywhere by the refused calls: the '' buckets are as they were.
    for scope in ("user", "session"):
        assert memory.store.read(StorageKey(scope, "", "k")) == (False, None)
        assert memory.store.read(StorageKey(scope, "", "conv")) == (False, None)
    for scope in ("workflow", "pipeline", "execution"):
        assert memory.read(scope, "k", context=None).value == f"shared-{scope}"
    figure(f"\nMEM-6/13 no fallback ({type(memory.store).__name__}): leaks {leaks}, "
          "'' bucket writes under refusal 0")
    assert leaks == 0


def test_mem6_mem13_buckets_of_different_identities_never_see_each_other(
        memory: Memory, figure: Figure) -> None:
    cases = [("user", "user_id", ["alice", "bob", "42", "carol "]),
             ("session", "session_id", ["s-1", "s-2", 17]),
             ("workflow", "workflow_id", ["wf-a", "wf-b"]),
             ("pipeline", "pipeline_id", ["p-a", "p-b"]),
             ("execution", "execution_id", ["e-a", "e-b"])]
    checks = 0
    for scope, field, owners in cases:
        for owner in owners:
            ctx = ExecutionContext(**{field: owner})
            assert memory.write(scope, "k", f"v-{owner}", context=ctx).ok
            memory.append(scope, "conv", {"role": "user", "content": f"m-{owner}"}, context=ctx)
        for owner in owners:
            ctx = ExecutionContext(**{field: owner})
            read = memory.read(scope, "k", context=ctx)
            assert (read.value, read.found) == (f"v-{owner}", True)
            assert read.resolved_scope_id == str(owner).strip() != ""
            history = memory.history(scope, "conv", context=ctx)
            assert [m["content"] for m in history.messages] == [f"m-{owner}"]
            checks += 1
        # the shared bucket of the scope saw none of them
        assert memory.store.read(StorageKey(scope, "", "k")) == (False, None)
        assert memory.store.read(StorageKey(scope, "", "conv")) == (False, None)
    # same id under two different scopes is two different buckets
    same = "shared-id"
    memory.write("user", "x", "as-user", context=ExecutionContext(user_id=same))
    memory.write("session", "x", "as-session", context=ExecutionContext(session_id=same))
    memory.write("workflow", "x", "as-workflow", context=ExecutionContext(workflow_id=same))
    assert memory.read("user", "x", context=ExecutionContext(user_id=same)).value == "as-user"
    assert memory.read("session", "x",
                       context=ExecutionContext(session_id=same)).value == "as-session"
    assert memory.read("workflow", "x",
                       context=ExecutionContext(workflow_id=same)).value == "as-workflow"
    # deleting one user's key leaves the others'
    assert memory.delete("user", "k", context=ExecutionContext(user_id="alice")).found
    assert memory.read("user", "k", context=ExecutionContext(user_id="bob")).found
    figure(f"\nMEM-6/13 isolation ({type(memory.store).__name__}): {checks} buckets, "
          "each sees only its own value and conversation")
    assert checks == 13


def test_mem7_delete_of_a_missing_key_outside_refusal_is_ok_not_found(memory: Memory,
        figure: Figure) -> None:
    deleted = memory.delete("user", "missing", context=ExecutionContext(user_id="u1"))
    figure(f"\nMEM-7 delete missing: ok={deleted.ok} found={deleted.found}")
    assert (deleted.ok, deleted.found, deleted.resolved_scope_id) == (True, False, "u1")


# -- Memory.from_url --------------------------------------------------------------------


def test_from_url_default_is_sqlite_flowmem_db_in_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, figure: Figure) -> None:
    monkeypatch.delenv("FLOWMEM_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
    with Memory.from_url() as memory:
        assert isinstance(memory.store, SQLiteStore)
        memory.write("global", "k", 1, context=None)
        path = memory.store.path
    figure(f"\nfrom_url(): {path}")
    assert Path(path) == tmp_path / "flowmem.db"
    assert (tmp_path / "flowmem.db").exists()


def test_from_url_uses_flowmem_store_env(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch, figure: Figure) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLOWMEM_STORE", "memory://")
    with Memory.from_url() as memory:
        assert isinstance(memory.store, InMemoryStore)
    monkeypatch.setenv("FLOWMEM_STORE", "sqlite:///from-env.db?synchronous=normal")
    with Memory.from_url() as memory:
        assert isinstance(memory.store, SQLiteStore)
        assert memory.store.synchronous == "normal"
        assert Path(memory.store.path) == tmp_path / "from-env.db"
    # an explicit url wins over the environment
    with Memory.from_url("memory://") as memory:
        assert isinstance(memory.store, InMemoryStore)
    figure("\nfrom_url(): $FLOWMEM_STORE honoured, explicit url wins")
    assert not (tmp_path / "flowmem.db").exists()


def test_from_url_relative_and_absolute_sqlite_paths(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                             figure: Figure) -> None:
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    absolute = tmp_path / "abs.db"
    assert str(absolute).startswith("/")
    urls = {"sqlite:///relative.db": work / "relative.db",
            f"sqlite:///{absolute}": absolute,  # = sqlite:////tmp/.../abs.db
            "sqlite:///sub%20dir.db": work / "sub dir.db"}
    for url, expected in urls.items():
        with Memory.from_url(url) as memory:
            memory.append("global", "conv", {"role": "user", "content": url}, context=None)
            assert Path(memory.store.path) == expected
        # the data is on disk at that path: reopen and read it back
        with Memory.from_url(url) as memory:
            assert memory.read("global", "conv", context=None).value[0]["content"] == url
        assert expected.exists()
    figure(f"\nfrom_url(): {len(urls)} sqlite URLs land where they say")
    assert f"sqlite:///{absolute}".startswith("sqlite:////")


@pytest.mark.parametrize("url", [
    "", "flowmem.db", "nope", "ftp://host/x", "MEMCACHE://x", "sqlite://", "sqlite:///",
    "sqlite://host/x.db", "sqlite:///x.db?synchronous=bogus", "sqlite:///x.db?foo=1",
    "sqlite:///x.db?busy_timeout=soon", 42, b"memory://",
])
def test_from_url_bad_url_is_invalid_store_url(url: Any, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                                       figure: Figure) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidStoreURL) as info:
        Memory.from_url(url)
    assert isinstance(info.value, FlowmemError) and isinstance(info.value, ValueError)
    figure(f"\nfrom_url({url!r}) -> InvalidStoreURL: {info.value}")
    assert os.listdir(tmp_path) == []


def test_from_url_context_manager_closes_the_store(tmp_path: Path, figure: Figure) -> None:
    url = f"sqlite:///{tmp_path / 'cm.db'}"
    with Memory.from_url(url) as memory:
        memory.write("global", "k", "v", context=None)
    with pytest.raises(StoreError):
        memory.read("global", "k", context=None)
    # closing on an exception too
    spy = SpyStore()
    with pytest.raises(RuntimeError), Memory(spy):  # type: ignore[arg-type]
        raise RuntimeError("boom")
    closes = [name for name, _, _ in spy.calls if name == "close"]
    with Memory.from_url(url) as memory:
        assert memory.read("global", "k", context=None).value == "v"
    figure(f"\nMemory context manager: closed after use, close calls on error {len(closes)}")
    assert closes == ["close"]


def test_from_url_sqlite_in_missing_directory_is_a_store_error(tmp_path: Path,
        figure: Figure) -> None:
    url = f"sqlite:///{tmp_path / 'no-such-dir' / 'x.db'}"
    with pytest.raises(FlowmemError) as info:
        Memory.from_url(url)
    figure(f"\nfrom_url({url!r}) -> {type(info.value).__name__}")
    assert isinstance(info.value, StoreError | InvalidStoreURL)


@pytest.mark.parametrize("value", ["nan", "-5"])
def test_from_url_sqlite_busy_timeout_must_be_finite_and_not_negative(
        value: str, tmp_path: Path, figure: Figure) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}?busy_timeout={value}"
    with pytest.raises(InvalidStoreURL):
        Memory.from_url(url).close()
    figure(f"\nfrom_url(busy_timeout={value}) -> InvalidStoreURL")
