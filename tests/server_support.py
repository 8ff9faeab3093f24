"""Shared helpers of the test_server_* files: an app, tokens per role, a seeded session."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient

from flowmem.memory import Memory
from flowmem.server import Settings, create_app

ROLES = ("anonymous", "owner", "viewer", "other", "admin")
USERS = {"owner": "alice", "viewer": "bob", "other": "carol", "admin": "root"}


@dataclass
class World:
    """One app, a token per role, and a session owned by ``owner`` viewed by ``viewer``."""

    app: FastAPI
    client: TestClient
    memory: Memory
    tokens: dict[str, str] = field(default_factory=dict)
    session_id: str = ""

    def headers(self, role: str) -> dict[str, str]:
        token = self.tokens.get(role)
        return {"Authorization": f"Bearer {token}"} if token else {}

    def call(self, role: str, method: str, path: str, body: Any = None,
             params: dict[str, Any] | None = None) -> Any:
        """One request as ``role``; the body is sent as ASCII JSON (lone surrogates too)."""
        headers = self.headers(role)
        content = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            content = json.dumps(body, ensure_ascii=True)
        return self.client.request(method, path, content=content, headers=headers,
                                   params=params)

    def token_for(self, user: str, *, admin: bool = False) -> str:
        return self.app.state.flowmem.tokens.create(user, admin=admin)

    def new_session(self, role: str, title: str = "", **extra: Any) -> str:
        response = self.call(role, "POST", "/v1/sessions", {"title": title, **extra})
        assert response.status_code == 201, response.text
        return str(response.json()["id"])


def make_world(store: str = "memory://", settings: Settings | None = None,
               seed: bool = True) -> World:
    """A fresh app over ``store`` with a token per role (and a seeded session)."""
    memory = Memory.from_url(store)
    app = create_app(memory, settings)
    world = World(app=app, client=TestClient(app), memory=memory)
    for role, user in USERS.items():
        world.tokens[role] = world.token_for(user, admin=role == "admin")
    if seed:
        world.session_id = world.new_session("owner", "seeded")
        granted = world.call("owner", "POST", f"/v1/sessions/{world.session_id}/viewers",
                             {"user_id": USERS["viewer"]})
        assert granted.status_code == 200, granted.text
        turn = world.call("owner", "POST", f"/v1/sessions/{world.session_id}/turns",
                          {"messages": [{"role": "user", "content": "hello"}]})
        assert turn.status_code == 200, turn.text
    return world


def free_port() -> int:
    """A TCP port free right now on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def live_server(app: FastAPI) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a thread; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
