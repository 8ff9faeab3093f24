"""The authorization matrix, extended: principals × scopes × grants × routes.

Principals: anonymous (closed, and each ``--anonymous`` opt-in), the session
owner, a viewer, a stranger, an admin, and two service tokens with grants
(``workflow:support-*:write`` + ``global:*:read``; ``*:*:read``). Scopes:
each shared scope on an id a grant covers and one it does not, ``user``,
``session`` without and with the seeded session. Routes: every memory route.
The session routes × principals are ``tests/test_server_authz.py``; the two
matrices together must cover the app's route list, so a new route cannot
ship unchecked.

The expected status of each cell comes from the rules as written in the
issue (:func:`expected`), not from the implementation.
"""

from __future__ import annotations

from typing import Any

import pytest

from attack_support import attack_world, case, expect, no_deviations
from authz_matrix import MATRIX as SESSION_MATRIX
from flowmem.access import Level
from flowmem.server import Settings
from server_support import World, app_routes

GRANTS = {"svc": ["workflow:support-*:write", "global:*:read"], "reader": ["*:*:read"]}
PRINCIPALS = ("anonymous", "owner", "viewer", "other", "admin", "svc", "reader")
ROUTES = {"read": "read", "history": "read", "write": "write", "delete": "write",
          "append": "write", "compact": "admin"}
SCOPES: dict[str, tuple[str, dict[str, str], bool]] = {
    # name: (scope, context, with the seeded session)
    "global": ("global", {}, False),
    "workflow support-7": ("workflow", {"workflow_id": "support-7"}, False),
    "workflow billing": ("workflow", {"workflow_id": "billing"}, False),
    "workflow (none)": ("workflow", {}, False),
    "pipeline p-1": ("pipeline", {"pipeline_id": "p-1"}, False),
    "execution e-1": ("execution", {"execution_id": "e-1"}, False),
    "user": ("user", {}, False),
    "session (none)": ("session", {}, False),
    "session S": ("session", {}, True),
    "user via S": ("user", {}, True),
}


def _grant_covers(principal: str, scope: str, scope_id: str, level: str) -> bool:
    for grant in GRANTS.get(principal, ()):
        g_scope, pattern, g_level = grant.split(":")
        if g_scope not in ("*", scope):
            continue
        matches = pattern == "*" or (pattern.endswith("*") and scope_id.startswith(
            pattern[:-1])) or pattern == scope_id
        if matches and (g_level == "write" or level == "read"):
            return True
    return False


def expected(principal: str, scope_name: str, level: str, anonymous: str | None) -> int:
    """The rules of #9, stated independently of the implementation."""
    scope, context, with_session = SCOPES[scope_name]
    if level == "admin":  # an edit of stored messages: the administrative tier (MEM-15)
        if principal in ("anonymous", "admin"):
            return 401 if principal == "anonymous" else 200
        return 404 if with_session and principal not in ("owner", "viewer") else 403
    if principal == "anonymous":
        if with_session or anonymous is None:
            return 401
        if scope in ("user", "session"):
            return 200  # MEM-7: the neutral refusal, a success
        return 200 if anonymous == "write" or level == "read" else 401
    if with_session:
        if principal in ("owner", "admin"):
            return 200
        return 403 if principal == "viewer" else 404
    if scope in ("user", "session"):
        return 200  # the caller's own user scope; session without a session: MEM-7
    if principal == "admin":
        return 200
    scope_id = next(iter(context.values()), "")
    return 200 if _grant_covers(principal, scope, scope_id, level) else 403


def _body(op: str, scope_name: str, world: World) -> dict[str, Any]:
    scope, context, with_session = SCOPES[scope_name]
    body: dict[str, Any] = {"scope": scope, "key": f"k-{op}", "context": context}
    if with_session:
        body["session_id"] = world.session_id
    if op == "write":
        body["value"] = {"v": 1}
    elif op == "append":
        body["messages"] = [{"role": "user", "content": "m"}]
    elif op == "compact":
        body.update(keep_last=0, summary="s")
    return body


def _world(anonymous: str | None) -> World:
    world = attack_world(Settings(anonymous=Level(anonymous) if anonymous else None,
                                  rate_limit=0.0))
    for name, grants in GRANTS.items():
        world.tokens[name] = world.token_for(name, grants=grants)
    return world


@pytest.mark.parametrize("anonymous", [None, "read", "write"])
def test_memory_matrix(anonymous: str | None) -> None:
    world = _world(anonymous)
    for principal in PRINCIPALS:
        for scope_name in SCOPES:
            for op, level in ROUTES.items():
                want = expected(principal, scope_name, level, anonymous)
                response = world.call(principal, "POST", f"/v1/memory/{op}",
                                      _body(op, scope_name, world))
                label = f"matrix[{anonymous}] {principal} {op} {scope_name}"
                expect(label, response, want)
    no_deviations(f"matrix[{anonymous}] ")


def test_session_routes_for_grant_holders() -> None:
    """Grants reach shared scopes only: a service token is a stranger to sessions."""
    world = _world(None)
    for endpoint in SESSION_MATRIX:
        body = endpoint.body(world.session_id) if endpoint.body else None
        url = (endpoint.path.replace("{session_id}", world.session_id)
               .replace("{user_id}", "bob").replace("{position}", "0")
               .replace("{asset}", "app.js"))
        for principal in ("svc", "reader"):
            want = endpoint.expected["other"]
            expect(f"sessions {principal} {endpoint.method} {endpoint.path}",
                   world.call(principal, endpoint.method, url, body), want)
    no_deviations("sessions ")


def test_the_matrices_cover_every_route() -> None:
    world = _world(None)
    memory = {("POST", f"/v1/memory/{op}") for op in ROUTES}
    sessions = {(e.method, e.path) for e in SESSION_MATRIX}
    case("matrix covers the route list", memory | sessions == app_routes(world.app),
         str(app_routes(world.app) - memory - sessions))
    no_deviations("matrix covers")
