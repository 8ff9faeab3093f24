"""The pure access rules (flowmem.access): MEM-8, MEM-9, MEM-15."""

from __future__ import annotations

import itertools

import pytest

from flowmem.access import (
    Action,
    Principal,
    SessionRecord,
    authorize,
    decide,
    memory_principal,
    owns,
)

OWNER = Principal("alice")
VIEWER = Principal("bob")
OTHER = Principal("carol")
ADMIN = Principal("root", admin=True)
ANON = Principal.anonymous()
SESSION = SessionRecord(id="s1", owner="alice", viewers=frozenset({"bob"}))
OWNERLESS = SessionRecord(id="s2", owner=None, viewers=frozenset({"bob"}))
DRIVING = (Action.DRIVE, Action.MANAGE)


def allowed(principal: Principal, action: Action, session: SessionRecord | None) -> bool:
    return decide(principal, action, session).allowed


def test_mem9_owner_views_drives_and_manages() -> None:
    for action in (Action.VIEW, *DRIVING):
        assert allowed(OWNER, action, SESSION)


def test_mem9_viewer_views_but_cannot_drive() -> None:
    assert allowed(VIEWER, Action.VIEW, SESSION)
    decision = decide(VIEWER, Action.DRIVE, SESSION)
    assert not decision.allowed and decision.visible
    assert "MEM-9" in decision.reason
    assert not allowed(VIEWER, Action.MANAGE, SESSION)


def test_mem9_other_user_sees_nothing() -> None:
    for action in Action:
        decision = decide(OTHER, action, SESSION)
        assert not decision.allowed and not decision.visible


def test_mem9_anonymous_owns_nothing() -> None:
    assert not owns(ANON, SESSION)
    assert not owns(ANON, OWNERLESS)
    for action in Action:
        assert not allowed(ANON, action, SESSION)
        assert not allowed(ANON, action, OWNERLESS)


def test_mem9_ownerless_session_is_owned_by_nobody() -> None:
    for principal in (OWNER, VIEWER, OTHER, ANON, Principal("0"), Principal("  ")):
        assert not owns(principal, OWNERLESS)
        for action in DRIVING:
            assert not allowed(principal, action, OWNERLESS)
    assert allowed(VIEWER, Action.VIEW, OWNERLESS)
    assert allowed(ADMIN, Action.DRIVE, OWNERLESS)


@pytest.mark.parametrize("fake_id", [None, "", "  ", "0", 0, True, 1.5, ["alice"]])
def test_mem9_ownership_needs_real_identity_on_both_sides(fake_id: object) -> None:
    principal = Principal(fake_id)  # type: ignore[arg-type]
    session = SessionRecord(id="s", owner=fake_id)  # type: ignore[arg-type]
    assert principal.user_id is None and session.owner is None
    assert not owns(principal, session)
    assert not allowed(principal, Action.DRIVE, session)


def test_mem9_admin_may_drive_any_session() -> None:
    for action in (Action.VIEW, *DRIVING):
        assert allowed(ADMIN, action, SESSION)


def test_mem9_create_needs_identity_and_ownerless_needs_admin() -> None:
    assert not allowed(ANON, Action.CREATE, SessionRecord(id="", owner=None))
    assert allowed(OWNER, Action.CREATE, SessionRecord(id="", owner="alice"))
    assert not allowed(OWNER, Action.CREATE, SessionRecord(id="", owner=None))
    assert not allowed(OWNER, Action.CREATE, SessionRecord(id="", owner="bob"))
    assert allowed(ADMIN, Action.CREATE, SessionRecord(id="", owner=None))


def test_mem15_messages_editable_only_by_admin() -> None:
    for principal in (OWNER, VIEWER, OTHER, ANON):
        assert not allowed(principal, Action.EDIT_MESSAGE, SESSION)
    assert decide(OWNER, Action.EDIT_MESSAGE, SESSION).visible  # 403, not 404
    assert allowed(ADMIN, Action.EDIT_MESSAGE, SESSION)


def test_mem15_message_of_unloadable_session_is_denied() -> None:
    for principal, action in itertools.product((OWNER, ADMIN, ANON), Action):
        decision = decide(principal, action, None)
        assert not decision.allowed and not decision.visible
    assert not authorize(ADMIN, Action.EDIT_MESSAGE, None, [lambda *_: True]).allowed


def test_mem15_hooks_cannot_grant_what_the_rules_deny() -> None:
    asked: list[tuple[Principal, Action, SessionRecord | None]] = []

    def grant_everything(principal: Principal, action: Action,
                         session: SessionRecord | None) -> bool:
        asked.append((principal, action, session))
        return True

    cells = list(itertools.product((OWNER, VIEWER, OTHER, ADMIN, ANON), Action,
                                   (SESSION, OWNERLESS, None)))
    for principal, action, session in cells:
        assert authorize(principal, action, session, [grant_everything]) == \
            decide(principal, action, session)
    denied = [cell for cell in cells if not decide(*cell).allowed]
    assert len(denied) > len(cells) // 2
    assert all(decide(*cell).allowed for cell in asked)  # only ever asked about allowed cells


def test_mem15_hooks_are_not_asked_after_a_rule_denial() -> None:
    calls: list[Action] = []

    def spy(principal: Principal, action: Action, session: SessionRecord | None) -> bool:
        calls.append(action)
        return True

    assert not authorize(VIEWER, Action.DRIVE, SESSION, [spy]).allowed
    assert calls == []


def test_mem15_hooks_may_add_denials() -> None:
    def no_drive_on_weekends(principal: Principal, action: Action,
                             session: SessionRecord | None) -> bool:
        return action is not Action.DRIVE

    decision = authorize(OWNER, Action.DRIVE, SESSION, [no_drive_on_weekends])
    assert not decision.allowed and decision.visible
    assert authorize(OWNER, Action.VIEW, SESSION, [no_drive_on_weekends]).allowed


@pytest.mark.parametrize("verdict", [None, 1, "yes", False])
def test_mem15_a_hook_must_say_exactly_true_to_let_pass(verdict: object) -> None:
    decision = authorize(OWNER, Action.VIEW, SESSION, [lambda *_: verdict])  # type: ignore[arg-type,return-value]
    assert not decision.allowed


def test_mem15_a_hook_that_raises_denies() -> None:
    def broken(principal: Principal, action: Action, session: SessionRecord | None) -> bool:
        raise RuntimeError("boom")

    assert not authorize(ADMIN, Action.VIEW, SESSION, [broken]).allowed


def test_mem8_memory_principal_is_the_owner() -> None:
    assert memory_principal(SESSION) == "alice"


def test_mem8_ownerless_session_has_no_memory_principal() -> None:
    assert memory_principal(OWNERLESS) is None
    assert memory_principal(SessionRecord(id="s", owner="0")) is None


def test_session_record_round_trips_json() -> None:
    record = SessionRecord(id="s", owner="alice", title="t", viewers=frozenset({"b", "a"}),
                           status="stopped", created_at=1.0, updated_at=2.0)
    data = record.to_json()
    assert data["viewers"] == ["a", "b"]
    assert SessionRecord.from_json(data) == record
