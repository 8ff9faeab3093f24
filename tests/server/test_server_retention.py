"""``flowmem serve --retention``: the background sweep, its log line and its counters.

The memory's clock is injected (nothing sleeps until data expires); the
sweeper runs every few milliseconds and the test waits for its counters on
``/metrics``, bounded. The log line counts by scope and never shows a key or
any message content.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from flowmem import AsyncMemory, ExecutionContext
from flowmem.metrics import Metrics
from flowmem.server import Settings, create_app
from server_support import CheckedClient


def _expired(text: str) -> dict[str, float]:
    return {s.labels["scope"]: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == "flowmem_expired_total"}


def test_the_background_sweep_logs_one_line_and_counts_by_scope(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [time.time()]
    memory = AsyncMemory.from_url("memory://", metrics=Metrics(), clock=lambda: now[0],
                                  retention={"session": "1h", "user": "max_age:1d"})
    app = create_app(memory, Settings(rate_limit=0.0, metrics_public=True,
                                      sweep_interval=0.01, sweep_batch=2))
    secret = "the secret words of a user"
    seen: dict[str, Any] = {}
    with caplog.at_level(logging.INFO, logger="flowmem"), CheckedClient(app) as client:
        async def fill() -> None:
            for number in range(3):
                context = ExecutionContext(user_id=f"u{number}", session_id=f"s{number}")
                await memory.append("session", "talk", {"role": "user", "content": secret},
                                    context=context)
                await memory.write("user", "note", secret, context=context)

        client.portal.call(fill)
        now[0] += 2 * 86400
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            seen = _expired(client.get("/metrics").text)
            if seen.get("session") == 3 and seen.get("user") == 3:
                break
        assert seen == {"session": 3.0, "user": 3.0}
    lines = [r.getMessage() for r in caplog.records if "sweep deleted" in r.getMessage()]
    assert any("session=3" in line and "user=3" in line for line in lines), lines
    assert not any(secret in r.getMessage() or "talk" in r.getMessage()
                   for r in caplog.records)


def test_a_session_expires_with_its_conversation_over_http() -> None:
    from server_support import USERS, World

    now = [time.time()]
    memory = AsyncMemory.from_url("memory://", clock=lambda: now[0],
                                  retention={"session": "1h"})
    app = create_app(memory, Settings(rate_limit=0.0))
    client = CheckedClient(app)
    client.__enter__()
    world = World(app=app, client=client, memory=memory)
    try:
        for role in ("owner", "viewer"):
            world.tokens[role] = world.token_for(USERS[role])
        session = world.new_session("owner", "expiring")
        assert world.call("owner", "POST", f"/v1/sessions/{session}/viewers",
                          {"user_id": USERS["viewer"]}).status_code == 200
        assert world.call("owner", "POST", f"/v1/sessions/{session}/turns",
                          {"messages": [{"role": "user", "content": "hi"}]}).status_code == 200
        now[0] += 1800
        assert world.call("viewer", "GET", f"/v1/sessions/{session}").status_code == 200
        now[0] += 1801  # an hour after the turn and the record's last change
        assert world.call("owner", "GET", f"/v1/sessions/{session}").status_code == 404
        for role in ("owner", "viewer"):
            listed = world.call(role, "GET", "/v1/sessions", params={"role": role}).json()
            assert session not in [s["id"] for s in listed["data"]], role
        assert world.run(app.state.flowmem.sessions.sweep) == 1
    finally:
        try:
            world.run(memory.aclose)
        finally:
            client.__exit__(None, None, None)
