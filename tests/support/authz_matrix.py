"""The session routes × principals matrix: what each role may do on each route (MEM-9, MEM-15)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from server_support import ROLES, World

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
    Endpoint("GET", "/favicon.ico", PUBLIC),  # the page's icon: no data
    Endpoint("GET", "/metrics", METRICS),  # the administrative tier (or --metrics-public)
    Endpoint("DELETE", "/v1/users/{user_id}", METRICS),  # erasure: the administrative tier
    Endpoint("PUT", f"/v1/sessions/{S}/messages/{{position}}", ADMIN_ONLY,
             lambda sid: {"message": {"role": "user", "content": "edited"}}),
    Endpoint("DELETE", f"/v1/sessions/{S}/messages/{{position}}", ADMIN_ONLY),
    Endpoint("POST", "/v1/memory/read", _drive(), _memory({})),  # viewing never reaches memory
    Endpoint("POST", "/v1/memory/write", _drive(), _memory({"value": 1})),
    Endpoint("POST", "/v1/memory/delete", _drive(), _memory({})),
    Endpoint("POST", "/v1/memory/append", _drive(), _memory({"messages": [USER]})),
    Endpoint("POST", "/v1/memory/history", _drive(), _memory({"last": 10})),
    Endpoint("POST", "/v1/memory/compact", ADMIN_ONLY,  # an edit of stored messages (MEM-15)
             _memory({"keep_last": 0, "summary": "s"})),
]


def _url(endpoint: Endpoint, session_id: str) -> str:
    return (endpoint.path.replace(S, session_id).replace("{user_id}", "bob")
            .replace("{position}", "0").replace("{asset}", "app.js"))


def request_as(world: World, role: str, endpoint: Endpoint, session_id: str) -> Any:
    body = endpoint.body(session_id) if endpoint.body else None
    return world.call(role, endpoint.method, _url(endpoint, session_id), body,
                      params=endpoint.params)
