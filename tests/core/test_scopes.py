"""Scopes and identity: resolve_scope, MEM-6 (user) and MEM-13 (session)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from flowmem import (
    SCOPES,
    ExecutionContext,
    FlowmemError,
    InvalidInput,
    ScopeRefused,
    StorageKey,
    UnknownScope,
    resolve_scope,
)

UNUSABLE_IDS: list[Any] = [None, "", "  ", "\t\n", 0, "0", " 0 ", True, False, [], ["u1"],
                           {}, {"id": "u1"}, 1.0, 2.5, b"u1"]
FIELD = {"user": "user_id", "session": "session_id", "workflow": "workflow_id",
         "pipeline": "pipeline_id", "execution": "execution_id"}


def context(**ids: Any) -> ExecutionContext:
    """A context where every id is usable except the ones given."""
    full: dict[str, Any] = {"user_id": "u-1", "session_id": "s-1", "workflow_id": "w-1",
                            "pipeline_id": "p-1", "execution_id": "e-1", "node_id": "n-1"}
    full.update(ids)
    return ExecutionContext(**full)


def test_scope_names() -> None:
    assert SCOPES == ("global", "workflow", "pipeline", "execution", "session", "user")


# --------------------------------------------------------------------------- MEM-6


def test_mem6_user_scope_resolves_to_the_user_id() -> None:
    assert resolve_scope("user", context(user_id="alice")) == "alice"
    assert resolve_scope("user", ExecutionContext(user_id="alice")) == "alice"


def test_mem6_user_id_is_trimmed_and_int_cast() -> None:
    assert resolve_scope("user", context(user_id="  alice \n")) == "alice"
    assert resolve_scope("user", context(user_id=42)) == "42"


def test_mem6_user_scope_refuses_without_context() -> None:
    with pytest.raises(ScopeRefused) as caught:
        resolve_scope("user", None)
    assert caught.value.scope == "user"
    assert isinstance(caught.value, FlowmemError)


@pytest.mark.parametrize("user_id", UNUSABLE_IDS, ids=repr)
def test_mem6_user_scope_refuses_an_unusable_user_id(user_id: Any) -> None:
    with pytest.raises(ScopeRefused) as caught:
        resolve_scope("user", context(user_id=user_id))
    assert caught.value.scope == "user"
    assert isinstance(caught.value, FlowmemError)
    assert "user" in str(caught.value)


def test_mem6_refusal_is_not_the_shared_bucket() -> None:
    # refusing must never degrade to resolving to "" (everyone's bucket)
    outcomes = []
    for user_id in UNUSABLE_IDS:
        try:
            outcomes.append(resolve_scope("user", context(user_id=user_id)))
        except ScopeRefused:
            outcomes.append(None)
    assert outcomes == [None] * len(UNUSABLE_IDS)


def test_mem6_other_ids_do_not_stand_in_for_the_user() -> None:
    with pytest.raises(ScopeRefused):
        resolve_scope("user", context(user_id=None))  # session, workflow... all set
    with pytest.raises(ScopeRefused):
        resolve_scope("user", ExecutionContext(session_id="s-1", node_id="n"))


# --------------------------------------------------------------------------- MEM-13


def test_mem13_session_scope_resolves_to_the_session_id() -> None:
    assert resolve_scope("session", context(session_id=" s-9 ")) == "s-9"
    assert resolve_scope("session", context(session_id=9)) == "9"


def test_mem13_session_scope_refuses_without_context() -> None:
    with pytest.raises(ScopeRefused) as caught:
        resolve_scope("session", None)
    assert caught.value.scope == "session"


@pytest.mark.parametrize("session_id", UNUSABLE_IDS, ids=repr)
def test_mem13_session_scope_refuses_an_unusable_session_id(session_id: Any) -> None:
    with pytest.raises(ScopeRefused) as caught:
        resolve_scope("session", context(session_id=session_id))
    assert caught.value.scope == "session"


def test_mem13_user_id_does_not_stand_in_for_the_session() -> None:
    with pytest.raises(ScopeRefused):
        resolve_scope("session", ExecutionContext(user_id="alice"))


# --------------------------------------------------------------------------- other scopes


@pytest.mark.parametrize("ctx", [None, ExecutionContext(), context()],
                         ids=["none", "empty", "full"])
def test_global_resolves_to_the_empty_id(ctx: ExecutionContext | None) -> None:
    assert resolve_scope("global", ctx) == ""


@pytest.mark.parametrize("scope", ["workflow", "pipeline", "execution"])
def test_context_scopes_resolve_to_their_id(scope: str) -> None:
    ctx = context(**{FIELD[scope]: f"  {scope}-7 "})
    assert resolve_scope(scope, ctx) == f"{scope}-7"
    assert resolve_scope(scope, context(**{FIELD[scope]: 7})) == "7"


@pytest.mark.parametrize("scope", ["workflow", "pipeline", "execution"])
def test_context_scopes_share_the_empty_bucket_without_context(scope: str) -> None:
    assert resolve_scope(scope, None) == ""
    assert resolve_scope(scope, ExecutionContext()) == ""


@pytest.mark.parametrize("scope", ["workflow", "pipeline", "execution"])
@pytest.mark.parametrize("bad", UNUSABLE_IDS, ids=repr)
def test_context_scopes_share_the_empty_bucket_for_unusable_ids(scope: str, bad: Any) -> None:
    assert resolve_scope(scope, context(**{FIELD[scope]: bad})) == ""


@pytest.mark.parametrize("scope", ["workflow", "pipeline", "execution", "session", "user"])
def test_each_scope_reads_its_own_field(scope: str) -> None:
    ctx = ExecutionContext(**{FIELD[scope]: "mine"})
    assert resolve_scope(scope, ctx) == "mine"


@pytest.mark.parametrize("name", ["", "users", "User", "GLOBAL", " user", "user ", "node",
                                  "tenant", None, 1, "*"], ids=repr)
@pytest.mark.parametrize("ctx", [None, ExecutionContext(), ExecutionContext(user_id="u")],
                         ids=["none", "empty", "user"])
def test_unknown_scope_is_a_typed_error_not_a_refusal(name: Any,
                                                      ctx: ExecutionContext | None) -> None:
    with pytest.raises(UnknownScope) as caught:
        resolve_scope(name, ctx)
    exc = caught.value
    assert isinstance(exc, FlowmemError)
    assert isinstance(exc, ValueError)
    assert isinstance(exc, InvalidInput)
    assert not isinstance(exc, ScopeRefused)


# --------------------------------------------------------------------------- data classes


def test_execution_context_defaults_and_immutability() -> None:
    ctx = ExecutionContext()
    assert dataclasses.astuple(ctx) == (None, None, None, None, None, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.user_id = "u"  # type: ignore[misc]


def test_storage_key_is_a_value() -> None:
    key = StorageKey("user", "alice", "history")
    assert key == StorageKey(scope="user", scope_id="alice", key="history")
    assert hash(key) == hash(StorageKey("user", "alice", "history"))
    assert key != StorageKey("session", "alice", "history")
