"""The pure scope decision (flowmem.access.decide_scope, Grant): issue #9's grants.

Shared scopes only through grants (a glob on the resolved scope id; write
implies read), admin everything, anonymous only what the service opted in
to, the identity scopes never decided by grants.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowmem.access import SHARED_SCOPES, Grant, Level, Principal, decide_scope

SVC = Principal("svc", grants=(Grant.parse("workflow:support-*:write"),
                               Grant.parse("global:*:read")))
ANON = Principal.anonymous()


@pytest.mark.parametrize(("scope", "scope_id", "level", "allowed"), [
    ("workflow", "support-1", Level.WRITE, True),
    ("workflow", "support-1", Level.READ, True),  # write implies read
    ("workflow", "billing", Level.READ, False),
    ("workflow", "", Level.READ, False),  # the shared bucket matches only *
    ("global", "", Level.READ, True),
    ("global", "", Level.WRITE, False),  # read does not imply write
    ("pipeline", "support-1", Level.READ, False),  # a grant names its scope
])
def test_grants(scope: str, scope_id: str, level: Level, allowed: bool) -> None:
    assert decide_scope(SVC, scope, scope_id, level).allowed is allowed


@pytest.mark.parametrize("text", ["workflow:*", "user:*:read", "session:x:write",
                                  "workflow:*:admin", "workflow::read", "", "a:b:c:d"])
def test_bad_grants_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        Grant.parse(text)


def test_a_glob_may_hold_colons() -> None:
    grant = Grant.parse("workflow:team:a*:read")
    assert grant.pattern == "team:a*" and str(grant) == "workflow:team:a*:read"


ids = st.text(max_size=12)
levels = st.sampled_from(list(Level))
scopes = st.sampled_from(SHARED_SCOPES)


@given(scope=scopes, scope_id=ids, level=levels)
def test_admin_reaches_every_scope_and_a_plain_token_none(scope: str, scope_id: str,
                                                         level: Level) -> None:
    assert decide_scope(Principal("root", admin=True), scope, scope_id, level).allowed
    assert not decide_scope(Principal("alice"), scope, scope_id, level).allowed


@given(scope=scopes, scope_id=ids, level=levels,
       mode=st.sampled_from([None, Level.READ, Level.WRITE]))
def test_anonymous_gets_only_the_opt_in(scope: str, scope_id: str, level: Level,
                                        mode: Level | None) -> None:
    allowed = decide_scope(ANON, scope, scope_id, level, anonymous=mode).allowed
    assert allowed is (mode is Level.WRITE or (mode is Level.READ and level is Level.READ))


@given(scope=scopes, pattern=st.text(min_size=1, max_size=8), scope_id=ids)
def test_write_implies_read(scope: str, pattern: str, scope_id: str) -> None:
    principal = Principal("svc", grants=(Grant(scope, pattern, Level.WRITE),))
    if decide_scope(principal, scope, scope_id, Level.WRITE).allowed:
        assert decide_scope(principal, scope, scope_id, Level.READ).allowed


@given(scope=st.sampled_from(["user", "session"]), level=levels)
def test_identity_scopes_are_not_decided_by_grants(scope: str, level: Level) -> None:
    for principal in (ANON, Principal("alice"), SVC):
        assert decide_scope(principal, scope, "x", level).allowed
