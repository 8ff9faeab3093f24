"""The authorization matrix: every endpoint × {anonymous, owner, viewer, other, admin}.

Closed by default (#9: no token, 401 on every /v1 route), MEM-9 (viewers
never drive nor reach memory, anonymous owns nothing), MEM-15 (messages are
admin-only), MEM-8 (memory under a session). The matrix is checked against
the app's route list: a new endpoint without an entry fails. The scopes ×
grants dimension is ``tests/security/test_matrix.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from authz_matrix import MATRIX, Endpoint, S, request_as
from figures import Figure
from server_support import ROLES, World, app_routes, make_world


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
    response = request_as(world, role, endpoint, world.session_id)
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
        response = request_as(world, role, endpoint, foreign)
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
        assert request_as(world, role, endpoint, bogus).status_code == expected


def test_matrix_figures(figure: Figure) -> None:
    """The parametrized checks above are not vacuous: the foreign-id checks have endpoints
    that take a session id in the path and in a body (an empty list would only skip)."""
    sessions = len(SESSION_ENDPOINTS)
    figure(f"\nauthorization matrix: {len(MATRIX)} endpoints x {len(ROLES)} principals = "
          f"{len(CELLS)} cells; foreign-id checks on {sessions} endpoints")
    assert any(S in e.path for e in SESSION_ENDPOINTS)
    assert any(S not in e.path for e in SESSION_ENDPOINTS), "no body carries a session id"
