"""``GET /metrics``: the Prometheus text of one app's own registry.

The coordinator's counters (MEM-1/3/7/10/14, store latency) as the rules
counted them, HTTP requests by route TEMPLATE and status (never a raw path:
no session id reaches a label), time to the response head; an admin token
unless ``--metrics-public``; two apps in one process never share figures.
"""

from __future__ import annotations

import subprocess
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from flowmem.metrics import Metrics
from flowmem.server import Settings
from server_support import World, flowmem, free_port, make_world, serving


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _world(**settings: Any) -> World:
    return make_world(settings=Settings(rate_limit=0.0, **settings), seed=False,
                      metrics=Metrics())


def _scrape(world: World, role: str = "admin") -> dict[Any, float]:
    response = world.call(role, "GET", "/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return _samples(response.text)


def test_the_rules_counted_and_the_routes_by_template() -> None:
    world = _world()
    sid = world.new_session("owner", "m")
    turn = f"/v1/sessions/{sid}/turns"
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    for messages in (
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls":
                                              [call]}],
        [{"role": "user", "content": "again"}],                      # heals c1 (MEM-3)
        [{"role": "tool", "tool_call_id": "c1", "content": "late"}],  # replaces it (MEM-10)
        [{"role": "tool", "tool_call_id": "c1", "content": "late"}],  # a duplicate (MEM-1)
    ):
        assert world.call("owner", "POST", turn, {"messages": messages}).status_code == 200
    refused = world.call("owner", "POST", "/v1/memory/write",
                         {"scope": "session", "key": "k", "value": 1})  # MEM-7
    assert refused.json()["data"]["refused"] is True
    world.client.post(turn, content=b"{nope", headers={**world.headers("owner"),
                                                      "Content-Type": "application/json"})
    world.call("viewer", "GET", f"/v1/sessions/{sid}")  # bob is a stranger: 404
    world.call("owner", "GET", "/no/such/path")
    samples = _scrape(world)
    memory = {"backend": "memory"}
    assert _value(samples, "flowmem_appends_total", **memory) == 4
    assert _value(samples, "flowmem_messages_appended_total", **memory) == 3
    assert _value(samples, "flowmem_calls_healed_total", **memory) == 1
    assert _value(samples, "flowmem_placeholders_replaced_total", **memory) == 1
    assert _value(samples, "flowmem_results_dropped_total", **memory) == 1
    assert _value(samples, "flowmem_refusals_total", operation="write") == 1
    assert _value(samples, "flowmem_store_call_seconds_count", operation="append",
                  backend="memory") == 4
    template = "/v1/sessions/{session_id}/turns"
    assert _value(samples, "flowmem_http_requests_total", route=template, method="POST",
                  status="200") == 4
    assert _value(samples, "flowmem_http_requests_total", route=template, method="POST",
                  status="400") == 1  # the body gate's refusal is counted too
    assert _value(samples, "flowmem_http_requests_total", route="/v1/sessions/{session_id}",
                  method="GET", status="404") == 1
    assert _value(samples, "flowmem_http_requests_total", route="unmatched", method="GET",
                  status="404") == 1
    assert _value(samples, "flowmem_http_request_seconds_count", route=template,
                  method="POST") == 5
    text = world.call("admin", "GET", "/metrics").text
    assert sid not in text and "/no/such/path" not in text  # templates only


def test_metrics_need_an_admin_unless_public() -> None:
    closed = _world()
    assert closed.call("anonymous", "GET", "/metrics").status_code == 401
    assert closed.call("owner", "GET", "/metrics").json()["error_code"] == "forbidden"
    opened = _world(metrics_public=True)
    assert opened.call("anonymous", "GET", "/metrics").status_code == 200
    assert opened.call("owner", "GET", "/metrics").status_code == 200


def test_two_apps_in_one_process_keep_their_own_figures() -> None:
    first, second = _world(), _world()
    for _ in range(3):
        first.call("owner", "GET", "/v1/whoami")
    assert _value(_scrape(first), "flowmem_http_requests_total", route="/v1/whoami",
                  method="GET", status="200") == 3
    assert _value(_scrape(second), "flowmem_http_requests_total", route="/v1/whoami",
                  method="GET", status="200") == 0


def test_an_app_over_a_memory_without_metrics_still_counts_http() -> None:
    world = make_world()  # Memory.from_url without metrics
    samples = _scrape(world)
    assert not any(name.startswith("flowmem_appends") for name, _ in samples)
    assert _value(samples, "flowmem_http_requests_total", route="/v1/sessions/{session_id}/turns",
                  method="POST", status="200") == 1


def test_flowmem_serve_counts_and_metrics_public(tmp_path: Any) -> None:
    store = f"sqlite:///{tmp_path / 'm.db'}"
    token = subprocess.run(flowmem("token", "create", "--user", "alice", "--store", store),
                           check=True, capture_output=True, text=True).stdout.strip()
    auth = {"Authorization": f"Bearer {token}"}
    with serving(store, free_port()) as client:
        assert client.get("/metrics").status_code == 401  # closed by default
        assert client.get("/metrics", headers=auth).status_code == 403
    with serving(store, free_port(), "--metrics-public") as client:
        sid = client.post("/v1/sessions", json={}, headers=auth).json()["data"]["id"]
        client.post(f"/v1/sessions/{sid}/turns", headers=auth,
                    json={"messages": [{"role": "user", "content": "hi"}]})
        samples = _samples(client.get("/metrics").text)
        assert _value(samples, "flowmem_appends_total", backend="sqlite") == 1
        assert _value(samples, "flowmem_messages_appended_total", backend="sqlite") == 1


def test_the_route_label_is_the_template_starlette_matches() -> None:
    """The middleware's own pattern table labels every request as the routes' own matching
    does (a method mismatch is the route's; a path no route serves is ``unmatched``)."""
    from flowmem.server._metrics import _flatten, _Templates, route_template

    world = _world()
    routes = _flatten(list(world.app.router.routes), [])
    table = _Templates(routes)
    paths = ["/v1/sessions/abc/turns", "/v1/sessions/abc", "/v1/sessions", "/v1/whoami",
             "/v1/sessions/abc/messages/7", "/v1/memory/append", "/metrics", "/healthz",
             "/nowhere", "/v1/sessions/a/b/c", "/ui", "/openapi.json", ""]
    for path in paths:
        for method in ("GET", "POST", "PUT", "DELETE", "PATCH"):
            scope = {"type": "http", "path": path, "method": method, "root_path": ""}
            assert table.of(scope) == route_template(routes, scope), (method, path)
    world.close()


def test_fastapi_opentelemetry_is_off_unless_asked_for() -> None:
    """``Settings.otel`` (default off): FastAPI's own OpenTelemetry instrumentation, which
    otherwise looks for a configured provider on every request. Where the installed
    FastAPI has none (before 0.165), there is nothing to switch."""
    import inspect

    from fastapi import FastAPI

    from flowmem import AsyncMemory
    from flowmem.server import create_app

    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return
    memory = AsyncMemory.from_url("memory://")
    quiet, traced = create_app(memory), create_app(memory, Settings(otel=True))
    off = {"tracing": False, "metrics": False, "logs": False}
    assert {name: quiet._telemetry[name] for name in off} == off  # type: ignore[attr-defined]
    assert traced._telemetry["tracing"] is True  # type: ignore[attr-defined]
