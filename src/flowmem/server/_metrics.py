"""``GET /metrics``: the service's counters in the Prometheus text format.

One :class:`prometheus_client.CollectorRegistry` per app (never the global
one, so two apps in one process never mix their figures) holds:

- the coordinator's :class:`flowmem.metrics.Metrics` (appends, messages
  appended, MEM-1/2/3/10 drops, heals and replacements, MEM-7 refusals,
  MEM-12 fallbacks, idempotent replays, store errors, store-call latency),
  when the served memory has one (``flowmem serve`` always gives it one);
- ``flowmem_http_requests_total{route, method, status}``: every answer,
  by route TEMPLATE (``/v1/sessions/{session_id}``, never the raw path, so
  the label set stays small; ``unmatched`` for a path no route serves);
- ``flowmem_http_request_seconds{route, method}``: the time to the
  response head (for an event stream: until the stream opened);
- ``flowmem_erased_items_total{kind}``: what user erasures deleted, by kind.

The endpoint needs an admin token (MEM-15's administrative tier) unless
the service was started with ``--metrics-public`` (``Settings.metrics_public``).
"""

from __future__ import annotations

import time
from typing import Any, Final

from fastapi import APIRouter, FastAPI, Request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..metrics import BUCKETS
from ._deps import caller, state
from ._responses import ApiError

__all__ = ["UNMATCHED", "HttpMetrics", "MetricsMiddleware", "install", "router"]

UNMATCHED: Final = "unmatched"
"""The ``route`` label of a request no route serves."""

router = APIRouter(tags=["operations"])


class HttpMetrics:
    """The HTTP counters of one app, in that app's own registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter("flowmem_http_requests",
                                "HTTP requests answered, by route template, method and status",
                                ["route", "method", "status"], registry=registry)
        self.latency = Histogram("flowmem_http_request_seconds",
                                 "Seconds from the request to the response head, by route "
                                 "template", ["route", "method"], buckets=BUCKETS,
                                 registry=registry)
        self.erased = Counter("flowmem_erased_items", "Items deleted by user erasures "
                              "(DELETE /v1/users/{id}), by kind", ["kind"], registry=registry)
        self._children: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        """One answered request."""
        children = self._children.get((route, method, status))
        if children is None:  # a label set is looked up once, then kept (the set is small)
            children = (self.requests.labels(route, method, str(status)),
                        self.latency.labels(route, method))
            self._children[(route, method, status)] = children
        children[0].inc()
        children[1].observe(seconds)


def _flatten(routes: list[Any], into: list[Any]) -> list[Any]:
    for route in routes:
        nested = getattr(route, "effective_candidates", None)  # FastAPI's included routers
        if callable(nested):
            _flatten(list(nested()), into)
        elif hasattr(route, "path"):
            into.append(route)
    return into


def route_template(routes: list[Any], scope: Scope) -> str:
    """The template of the route ``scope`` reaches among ``routes`` (a method mismatch
    counts), else :data:`UNMATCHED`."""
    partial = None
    for route in routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return str(getattr(route, "path", UNMATCHED))
        if match is Match.PARTIAL and partial is None:
            partial = str(getattr(route, "path", UNMATCHED))
    return partial or UNMATCHED


class _Templates:
    """:func:`route_template` by each route's own path pattern and methods, without the
    framework's per-route matching machinery (a route without them is asked itself)."""

    def __init__(self, routes: list[Any]) -> None:
        self.rows = [(getattr(r, "path_regex", None), getattr(r, "methods", None),
                      str(getattr(r, "path", UNMATCHED)), r) for r in routes]

    def of(self, scope: Scope) -> str:
        path, root = scope["path"], scope.get("root_path", "")
        if root and path.startswith(root):  # as starlette's routes see it
            path = path[len(root):]
        partial = None
        for regex, methods, template, route in self.rows:
            if regex is None or methods is None:
                match, _ = route.matches(scope)
            elif regex.match(path) is None:
                continue
            else:
                match = Match.FULL if scope["method"] in methods else Match.PARTIAL
            if match is Match.FULL:
                return template
            if match is Match.PARTIAL and partial is None:
                partial = template
        return partial or UNMATCHED


class MetricsMiddleware:
    """ASGI middleware (outermost): count every answer, gate refusals included."""

    def __init__(self, app: ASGIApp, owner: FastAPI, http: HttpMetrics) -> None:
        self.app = app
        self.owner = owner
        self.http = http
        self._templates: _Templates | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        if self._templates is None:  # the route list is final once the app serves
            self._templates = _Templates(_flatten(list(self.owner.router.routes), []))
        route = self._templates.of(scope)
        method = str(scope.get("method", "GET"))
        seen = False

        async def counting(message: Message) -> None:
            nonlocal seen
            if message["type"] == "http.response.start" and not seen:
                seen = True
                self.http.observe(route, method, int(message["status"]),
                                  time.perf_counter() - started)
            await send(message)

        try:
            await self.app(scope, receive, counting)
        finally:
            if not seen:  # the client went away, or a failure after nothing was sent
                self.http.observe(route, method, 499, time.perf_counter() - started)


def install(app: FastAPI) -> HttpMetrics:
    """Give ``app`` its registry, the memory's collector and the middleware (outermost)."""
    registry = CollectorRegistry()
    memory_metrics = getattr(state_of(app).memory, "metrics", None)
    if memory_metrics is not None:
        memory_metrics.prometheus(registry)
    http = HttpMetrics(registry)
    app.state.flowmem_metrics = http
    app.include_router(router)
    app.add_middleware(MetricsMiddleware, owner=app, http=http)
    return http


def state_of(app: FastAPI) -> Any:
    """The app's ``ServerState``."""
    return app.state.flowmem


@router.get("/metrics", include_in_schema=False,
            summary="Prometheus text format (admin token, unless --metrics-public)")
async def metrics(request: Request) -> Response:
    server = await state(request)
    if not server.settings.metrics_public:
        principal = await caller(request, None)
        if not principal.identified:
            raise ApiError("unauthenticated", "metrics need an admin token",
                           headers={"WWW-Authenticate": "Bearer"})
        if not principal.admin:
            raise ApiError("forbidden", "metrics are for the administrative tier "
                           "(or start the service with --metrics-public)")
    http: HttpMetrics = request.app.state.flowmem_metrics
    body = await run_in_threadpool(generate_latest, http.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST,
                    headers={"Cache-Control": "no-store"})
