"""The authorization matrix: every endpoint × {anonymous, owner, viewer, other, admin}.

Closed by default (#9: no token, 401 on every /v1 route), MEM-9 (viewers
never drive nor reach memory, anonymous owns nothing), MEM-15 (messages are
admin-only), MEM-8 (memory under a session). The matrix is checked against
the app's route list: a new endpoint without an entry fails. The scopes ×
grants dimension is ``tests/security/test_matrix.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from server_support import ROLES, World, app_routes, make_world

S = "{session_id}"


def _view(ok: int = 200) -> dict[str, int]:
    return {"anonymous": 401, "owner": ok, "viewer": ok, "other": 404, "admin": ok}


def _drive(ok: int = 200) -> dict[str, int]:
    return {"anonymous": 401, "owner": ok, "viewer": 403, "other": 404, "admin": ok}


ADMIN_ONLY = {"anonymous": 401, "owner": 403, "viewer": 403, "other": 404, "admin": 200}
PUBLIC = dict.fromkeys(ROLES, 200)
IDENTIFIED = {"anonymous": 401, "owner": 200, "viewer": 200, "other": 200, "admin": 200}
CREATED = {**IDENTIFIED, "owner": 201, "viewer": 201, "other": 201, "admin": 201}
METRICS = {"anonymous": 401, "owner": 403, "viewer": 403, "other": 403, "admin": 200}
USER = {"role": "user", "content": "ping"}


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    expected: dict[str, int]
    body: Callable[[str], Any] | None = None
    params: dict[str, Any] | None = None


def _memory(extra: dict[str, Any]) -> Callable[[str], Any]:
    return lambda sid: {"scope": "session", "key": "k", "session_id": sid, **extra}


MATRIX = [
    Endpoint("GET", "/healthz", PUBLIC),
    Endpoint("GET", "/openapi.json", PUBLIC),
    Endpoint("GET", "/v1/whoami", IDENTIFIED),
    Endpoint("POST", "/v1/sessions", CREATED, lambda sid: {"title": "t"}),
    Endpoint("GET", "/v1/sessions", IDENTIFIED),
    Endpoint("GET", f"/v1/sessions/{S}", _view()),
    Endpoint("POST", f"/v1/sessions/{S}/viewers", _drive(), lambda sid: {"user_id": "dave"}),
    Endpoint("DELETE", f"/v1/sessions/{S}/viewers/{{user_id}}", _drive()),
    Endpoint("POST", f"/v1/sessions/{S}/turns", _drive(), lambda sid: {"messages": [USER]}),
    Endpoint("POST", f"/v1/sessions/{S}/stop", _drive()),
    Endpoint("POST", f"/v1/sessions/{S}/reset", _drive()),
    Endpoint("GET", f"/v1/sessions/{S}/messages", _view()),
    Endpoint("GET", f"/v1/sessions/{S}/events", _view(), params={"timeout": 0}),  # as reading
    Endpoint("GET", "/ui", PUBLIC),  # the page holds no data: it asks for a token
    Endpoint("GET", "/ui/{asset}", PUBLIC),
    Endpoint("GET", "/metrics", METRICS),  # the administrative tier (or --metrics-public)
    Endpoint("PUT", f"/v1/sessions/{S}/messages/{{position}}", ADMIN_ONLY,
             lambda sid: {"message": {"role": "user", "content": "edited"}}),
    Endpoint("DELETE", f"/v1/sessions/{S}/messages/{{position}}", ADMIN_ONLY),
    Endpoint("POST", "/v1/memory/read", _drive(), _memory({})),  # viewing never reaches memory
    Endpoint("POST", "/v1/memory/write", _drive(), _memory({"value": 1})),
    Endpoint("POST", "/v1/memory/delete", _drive(), _memory({})),
    Endpoint("POST", "/v1/memory/append", _drive(), _memory({"messages": [USER]})),
    Endpoint("POST", "/v1/memory/history", _drive(), _memory({"last": 10})),
]


def _url(endpoint: Endpoint, session_id: str) -> str:
    return (endpoint.path.replace(S, session_id).replace("{user_id}", "bob")
            .replace("{position}", "0").replace("{asset}", "app.js"))


def _request(world: World, role: str, endpoint: Endpoint, session_id: str) -> Any:
    body = endpoint.body(session_id) if endpoint.body else None
    return world.call(role, endpoint.method, _url(endpoint, session_id), body,
                      params=endpoint.params)


def test_matrix_covers_every_route() -> None:
    world = make_world(seed=False)
    listed = {(e.method, e.path) for e in MATRIX}
    assert app_routes(world.app) == listed, "every endpoint needs a row in the authorization matrix"
    assert all(set(e.expected) == set(ROLES) for e in MATRIX)


CELLS = [(e, role) for e in MATRIX for role in ROLES]


@pytest.mark.parametrize(("endpoint", "role"), CELLS,
                         ids=[f"{e.method} {e.path} as {r}" for e, r in CELLS])
def test_matrix_cell(endpoint: Endpoint, role: str) -> None:
    world = make_world()
    response = _request(world, role, endpoint, world.session_id)
    assert response.status_code == endpoint.expected[role], response.text
    if response.status_code >= 400:
        assert set(response.json()) >= {"success", "error", "error_code"}


def _snapshot(world: World, session_id: str) -> tuple[Any, Any]:
    record = world.call("admin", "GET", f"/v1/sessions/{session_id}").json()["data"]
    messages = world.call("admin", "GET", f"/v1/sessions/{session_id}/messages").json()
    record.pop("updated_at")
    return record, messages


SESSION_ENDPOINTS = [e for e in MATRIX if S in e.path or (e.body and "session_id" in
                                                            str(e.body("X")))]


@pytest.mark.parametrize("endpoint", SESSION_ENDPOINTS,
                         ids=[f"{e.method} {e.path}" for e in SESSION_ENDPOINTS])
def test_foreign_session_id_is_refused_everywhere(endpoint: Endpoint) -> None:
    """A session owned by someone else, in a path or a body field: 404, nothing changed."""
    world = make_world()
    world.tokens["mallory"] = world.token_for("mallory")
    foreign = world.new_session("mallory", "mallory's")
    world.call("mallory", "POST", f"/v1/sessions/{foreign}/turns",
               {"messages": [{"role": "user", "content": "CANARY-mallory"}]})
    before = _snapshot(world, foreign)
    for role in ("anonymous", "owner", "viewer", "other"):
        response = _request(world, role, endpoint, foreign)
        assert response.status_code == (401 if role == "anonymous" else 404), (role, response.text)
        assert "CANARY" not in response.text
    assert _snapshot(world, foreign) == before


@pytest.mark.parametrize("endpoint", SESSION_ENDPOINTS,
                         ids=[f"{e.method} {e.path}" for e in SESSION_ENDPOINTS])
@pytest.mark.parametrize("bogus", ["0" * 32, "not-a-session", "%20", "0"])
def test_unknown_session_id_is_refused_even_for_admin(endpoint: Endpoint, bogus: str) -> None:
    """MEM-15: a message (or anything) whose session cannot be loaded is denied."""
    world = make_world(seed=False)
    for role in ROLES:
        expected = 401 if role == "anonymous" else 404  # closed by default: no token, no look
        assert _request(world, role, endpoint, bogus).status_code == expected


def test_matrix_figures() -> None:
    sessions = len(SESSION_ENDPOINTS)
    print(f"\nauthorization matrix: {len(MATRIX)} endpoints x {len(ROLES)} principals = "
          f"{len(CELLS)} cells; foreign-id checks on {sessions} endpoints")
    assert len(CELLS) == len(MATRIX) * len(ROLES)
