"""Shared helpers of the server tests: an app, tokens per role, a seeded session.

The app runs on ONE event loop: a :class:`World`'s client is a TestClient
entered as a context manager, so one portal (one loop) serves every request,
and whatever a test does to the app's store runs on that loop too
(:meth:`World.run`) — a PostgreSQL pool or a Redis client is bound to the loop
that first used it. conftest closes every world a test opened.

Every response any server test receives through :class:`CheckedClient` (or an
httpx client with :func:`check_envelope` as a response hook) is checked
against the envelopes (API-5, API-8): a refusal is
``{success: false, error, error_code}`` with a code of the published table
and that code's status; a JSON result is ``{success: true, data[, pagination]}``.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient

from flowmem.async_memory import AsyncMemory
from flowmem.metrics import Metrics
from flowmem.server import Settings, create_app
from flowmem.server._responses import ERROR_CODES

REFUSALS: Counter[str] = Counter()
"""error_code -> how many refusals the tests of this run provoked."""
_COUNT_LOCK = threading.Lock()


def check_envelope(response: Any) -> None:
    """Assert the envelope of one response (a refusal: a code from the table, API-8)."""
    if response.request.url.path == "/openapi.json":
        return
    kind = response.headers.get("content-type", "")
    if response.status_code >= 400:
        assert kind.startswith("application/json"), (response.status_code, kind)
    if not kind.startswith("application/json"):
        return
    response.read()
    body = response.json()
    if response.status_code >= 400:
        assert body["success"] is False and isinstance(body["error"], str), body
        code = body["error_code"]
        assert code in ERROR_CODES, f"{code!r} is not in the published table"
        assert ERROR_CODES[code][0] == response.status_code, (code, response.status_code)
        assert set(body) <= {"success", "error", "error_code", "details", "request_id"}
        with _COUNT_LOCK:
            REFUSALS[code] += 1
    else:
        assert body["success"] is True and "data" in body, body
        assert set(body) in ({"success", "data"}, {"success", "data", "pagination"}), body
        if "pagination" in body:
            assert list(body["pagination"]) == ["total", "limit", "offset", "has_more"]


class CheckedClient(TestClient):
    """A TestClient that checks the envelope of every response (enter it: ``with``)."""

    def request(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        response = super().request(*args, **kwargs)
        check_envelope(response)
        return response

ROLES = ("anonymous", "owner", "viewer", "other", "admin")
USERS = {"owner": "alice", "viewer": "bob", "other": "carol", "admin": "root"}


@dataclass
class World:
    """One app, a token per role, and a session owned by ``owner`` viewed by ``viewer``."""

    app: FastAPI
    client: TestClient
    memory: AsyncMemory
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

    def run(self, function: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
        """``await function(*args, **kwargs)`` on the app's own loop (the client's portal)."""
        async def call() -> Any:
            return await function(*args, **kwargs)

        return self.client.portal.call(call)

    def token_for(self, user: str, *, admin: bool = False, **options: Any) -> str:
        return str(self.run(self.app.state.flowmem.tokens.create, user, admin=admin,
                            **options))

    def close(self) -> None:
        """Close the memory on the app's loop, then the client (its loop and lifespan)."""
        if self in _OPEN:
            _OPEN.remove(self)
            try:
                self.run(self.memory.aclose)
            finally:
                self.client.__exit__(None, None, None)

    def new_session(self, role: str, title: str = "", **extra: Any) -> str:
        response = self.call(role, "POST", "/v1/sessions", {"title": title, **extra})
        assert response.status_code == 201, response.text
        return str(response.json()["data"]["id"])


def make_world(store: str = "memory://", settings: Settings | None = None,
               seed: bool = True, client_class: type[CheckedClient] = CheckedClient,
               metrics: Metrics | None = None) -> World:
    """A fresh app over ``store`` with a token per role (and a seeded session).

    The rate limit is off unless ``settings`` ask for one (its own tests do);
    ``metrics`` counts what the memory does (``/metrics`` shows it).
    """
    memory = AsyncMemory.from_url(store, metrics=metrics)
    settings = settings or Settings(rate_limit=0.0)
    app = create_app(memory, settings)
    client = client_class(app)
    client.__enter__()  # one portal, one loop, for every request of this world
    world = World(app=app, client=client, memory=memory)
    _OPEN.append(world)
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


_OPEN: list[World] = []


def open_worlds() -> list[World]:
    """The worlds not closed yet, oldest first."""
    return list(_OPEN)


def close_worlds(keep: int = 0) -> None:
    """Close every open world but the ``keep`` oldest (conftest's fixtures call it)."""
    for world in reversed(_OPEN[keep:]):
        world.close()


def free_port() -> int:
    """A TCP port free right now on 127.0.0.1, for a server a test starts: drawn below the
    kernel's ephemeral range (32768 and up), where ``bind(0)`` picks, so that no port
    handed out by ``bind(0)`` elsewhere can be taken by two servers between the probe and
    the bind, and then answer another test's requests."""
    chooser = random.SystemRandom()
    while True:
        port = chooser.randrange(20000, 32000)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


@contextmanager
def live_server(app: FastAPI, http: Any = "auto") -> Iterator[str]:
    """Serve ``app`` with uvicorn in a thread (``http``: its protocol); yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, http=http,
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


def _walk(routes: list[Any], found: set[tuple[str, str]]) -> None:
    for route in routes:
        nested = getattr(route, "effective_candidates", None)  # FastAPI's included routers
        if callable(nested):
            _walk(nested(), found)
        elif getattr(route, "methods", None):
            found.update((m, route.path) for m in route.methods if m != "HEAD")
        else:
            raise AssertionError(f"a route the tests cannot read: {route!r}")


def app_routes(app: FastAPI) -> set[tuple[str, str]]:
    """Every (method, path) the app serves, from its route list."""
    found: set[tuple[str, str]] = set()
    _walk(list(app.routes), found)
    return found


def flowmem(*args: str) -> list[str]:
    """The ``flowmem`` command line."""
    script = shutil.which("flowmem")
    return [script, *args] if script else [sys.executable, "-m", "flowmem.cli", *args]


STARTUP = 60.0
"""Seconds ``flowmem serve`` may take to answer /healthz: a bound for a loaded machine,
never waited out by a process that came up (its health is polled)."""


@contextmanager
def serving(store: str, port: int, *options: str, output: list[str] | None = None,
            started: list[subprocess.Popen[bytes]] | None = None) -> Iterator[httpx.Client]:
    """A real ``flowmem serve`` process on ``port``; yields a client; SIGTERM at the end.

    ``output`` (if given) receives what the process printed; ``started`` the process.
    """
    process = subprocess.Popen(flowmem("serve", "--store", store, "--port", str(port),
                                       "--log-level", "warning", *options),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if started is not None:
        started.append(process)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP
        while True:
            assert process.poll() is None, process.communicate()[0].decode()
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "flowmem serve did not come up"
            time.sleep(0.05)
        with httpx.Client(base_url=base, timeout=10,
                          event_hooks={"response": [check_envelope]}) as client:
            yield client
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        printed = process.communicate()[0].decode("utf-8", "replace")
        if output is not None:
            output.append(printed)
        # uvicorn shuts down gracefully, then re-raises the signal: -SIGTERM (or 0)
        assert code in (0, -signal.SIGTERM), printed
