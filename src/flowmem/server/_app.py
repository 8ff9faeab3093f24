"""``create_app(memory, settings)``: the storage API of GR-MEM over HTTP.

A thin asyncio layer over :class:`~flowmem.AsyncMemory` and its
:class:`~flowmem.store.AsyncStore` (every endpoint a coroutine, no thread
pool): the gates
(:mod:`.gate`: Host, the one body gate, the generic failure),
authentication (:mod:`.auth`), the access rules (:mod:`flowmem.access`,
MEM-8/9/15), the session registry (:mod:`.sessions`) and the limits
(:mod:`.limits`). Every JSON response is an envelope of :mod:`.responses`;
every refusal carries a code of :data:`~.responses.ERROR_CODES` (API-8).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from starlette.exceptions import HTTPException
from starlette.responses import Response

from .. import __version__
from ..async_memory import AsyncMemory
from ..errors import (
    ErasureInProgress,
    FlowmemError,
    IdempotencyConflict,
    InvalidInput,
    InvalidMessage,
    InvalidValue,
    KeyConflict,
    OutcomeUnknown,
    StoreBusy,
    StoreError,
    StoreReadOnly,
    StoreUnavailable,
)
from ..service._changes import Changes
from ..service._sessions import SessionRegistry
from ..service._sweeper import sweep_forever
from ..service._tokens import TokenBackend
from ..service._writers import WriterRecords
from . import (
    _metrics as metrics_http,
)
from . import (
    _routes_compact as routes_compact,
)
from . import (
    _routes_events as routes_events,
)
from . import (
    _routes_memory as routes_memory,
)
from . import (
    _routes_meta as routes_meta,
)
from . import (
    _routes_sessions as routes_sessions,
)
from . import (
    _routes_ui as routes_ui,
)
from . import (
    _routes_users as routes_users,
)
from ._deps import ServerState, admit, strict_query
from ._fastpath import TurnsFastPath
from ._gate import BodyGate, Failures, HostGate, new_request_id
from ._ratelimit import RateLimiter
from ._responses import ERROR_RESPONSES, ApiError, AsciiJSONResponse, ErrorBody, error_response
from ._settings import Settings

__all__ = ["create_app"]

logger = logging.getLogger("flowmem")

_DESCRIPTION = """\
Conversation memory for LLM agent workflows (the GR-MEM rules, storage-api profile).

**Envelopes**: a result is `{{"success": true, "data": ...}}`; a paged result adds
`"pagination": {{"total", "limit", "offset", "has_more"}}` (`limit` clamped to 1..100,
`offset` floored at 0, API-6); a refusal is `{{"success": false, "error": text,
"error_code": code}}` with `details` where fields are named. The codes are published in
docs/http.md and never reused (API-8).

**Refusals (MEM-7)**: a memory operation under a refused scope (`user` without a real
user, `session` without a session) answers **200** with the neutral result and
`refused: true` inside `data` — a read `found: false` with the default, a write or delete
`ok: false`, an append `count: 0` and no messages; `resolved_scope_id` is `""`.

**Access (MEM-8, MEM-9, MEM-15)**: a session the caller may not see answers 404 before any
403; viewers never drive; session messages are evicted, edited or deleted by admins only.

**The body gate (STORE-1, API-1)**: every body is JSON sent as `application/json`, an object
or an array, at most {body} bytes, nested at most {depth} levels, with finite numbers only;
else **400**. Then each door's own limits: {messages} messages per append, {content}
characters of content and {message_bytes} bytes per message (metadata included),
{value_bytes} bytes per value, unknown fields and wrong JSON types refused (400).
"""


def _public_part(part: Any) -> bool:
    """Whether a part of pydantic's error location is the body's own (a field name, an
    index) rather than a union member's internal type name (``list[MessageIn]``)."""
    return not (isinstance(part, str) and ("[" in part or "]" in part))


def _details(exc: RequestValidationError) -> list[dict[str, Any]]:
    """One detail per (code, locator), located as the documented fields are
    (``body.messages.0.role``), never by an internal type name."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for err in exc.errors():
        locator = ".".join(str(p) for p in err.get("loc", ()) if _public_part(p))
        code = str(err.get("type", "invalid"))
        found.setdefault((code, locator), {"code": code,
                                           "message": str(err.get("msg", "invalid")),
                                           "locator": locator})
    return list(found.values())


def _message_details(exc: InvalidMessage) -> list[dict[str, Any]]:
    locator = exc.where if exc.index is None else f"{exc.where}[{exc.index}]"
    if exc.field:
        locator = f"{locator}.{exc.field}"
    return [{"code": "invalid_message", "message": exc.reason, "locator": locator}]


def _store_failure(exc: StoreError) -> Response:
    request_id = new_request_id()
    logger.error("flowmem: request %s: store error: %s", request_id, exc)
    if isinstance(exc, StoreBusy):
        return error_response("store_busy", "the store is busy; nothing was changed; retry",
                              request_id=request_id, headers={"Retry-After": "1"})
    if isinstance(exc, StoreReadOnly):
        return error_response("store_read_only", "the store is read-only; nothing was changed",
                              request_id=request_id)
    if isinstance(exc, OutcomeUnknown):  # sent, its answer lost: never "nothing changed"
        return error_response("outcome_unknown", "the store lost the answer to this change: "
                              "it may or may not have been stored; retry with the same "
                              "Idempotency-Key", request_id=request_id,
                              headers={"Retry-After": "1"})
    if isinstance(exc, StoreUnavailable):
        return error_response("store_unavailable",
                              "the store cannot be reached; nothing was changed",
                              request_id=request_id)
    return error_response("store_failed", "the store failed; the cause is logged under this "
                          "request id", request_id=request_id)


def _flowmem_failure(exc: FlowmemError) -> Response:
    if isinstance(exc, ErasureInProgress):  # expected while an erasure runs: no error logged
        return error_response("erasure_in_progress", str(exc), headers={"Retry-After": "1"})
    if isinstance(exc, StoreError):
        return _store_failure(exc)
    if isinstance(exc, KeyConflict):
        return error_response("key_conflict", str(exc))
    if isinstance(exc, IdempotencyConflict):
        # the store's message names the caller-namespaced key: never in a body
        return error_response("idempotency_key_reused",
                              "this Idempotency-Key was already used for a different request; "
                              "a retry must repeat the first one exactly")
    if isinstance(exc, InvalidMessage):
        return error_response("invalid_message", str(exc), details=_message_details(exc))
    if isinstance(exc, InvalidValue):
        return error_response("invalid_value", str(exc))
    if isinstance(exc, InvalidInput):
        return error_response("invalid_input", str(exc))
    request_id = new_request_id()
    logger.error("flowmem: request %s: unclassified error: %r", request_id, exc)
    return error_response("internal_error", "internal error; the cause is logged under this "
                          "request id", request_id=request_id)


def _install_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> Response:
        return error_response(exc.code, exc.message, details=exc.details, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> Response:
        details = _details(exc)
        first = details[0] if details else {"locator": "", "message": "invalid request"}
        where = first["locator"]
        message = f"{where}: {first['message']}" if where else str(first["message"])
        return error_response("invalid_field", message, details=details)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> Response:
        code = {404: "route_not_found", 405: "method_not_allowed"}.get(exc.status_code,
                                                                        "body_not_json")
        headers = dict(exc.headers) if exc.headers else None
        message = {404: "no such route", 405: "method not allowed"}.get(
            exc.status_code, "the body is not JSON")
        return error_response(code, message, headers=headers)

    @app.exception_handler(FlowmemError)
    async def flowmem_error(_: Request, exc: FlowmemError) -> Response:
        return _flowmem_failure(exc)


def _openapi(app: FastAPI, settings: Settings) -> dict[str, Any]:
    if app.openapi_schema is not None:
        return app.openapi_schema
    limits = settings.limits
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes,
                         description=_DESCRIPTION.format(
                             body=limits.max_body_bytes, depth=limits.max_json_depth,
                             messages=limits.max_messages_per_append,
                             content=limits.max_content_chars,
                             message_bytes=limits.max_message_bytes,
                             value_bytes=limits.max_value_bytes))
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    components["Error"] = ErrorBody
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            # FastAPI's own 422 (validation) never answers here: ours is a refusal code
            operation.get("responses", {})["422"] = ERROR_RESPONSES[422]
            # The token is optional only where the service opted in to anonymous callers.
            needs_identity = (operation.pop("x-requires-identity", False)
                              or path.startswith("/v1/sessions"))
            if operation.get("security") and settings.anonymous is not None \
                    and not needs_identity:
                operation["security"] = [*operation["security"], {}]
            for answer in operation.get("responses", {}).values():
                if "Retry-After" not in answer.get("headers", {}) and \
                        answer.get("description", "").startswith("Refused: `rate_limited`"):
                    answer["headers"] = {"Retry-After": {"schema": {"type": "string"}}}
    app.openapi_schema = schema
    return schema


def _telemetry(otel: bool) -> dict[str, Any]:
    """FastAPI's own OpenTelemetry instrumentation off unless asked for (``Settings.otel``),
    on a FastAPI that has it (0.165 and later)."""
    if otel or "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}


def create_app(memory: AsyncMemory, settings: Settings | None = None, *,
               owns_memory: bool = False) -> FastAPI:
    """The ASGI app serving ``memory`` (see the module notes and ``docs/http.md``).

    The caller keeps ``memory`` by default: it opened it, it closes it (with
    ``await memory.aclose()`` on the loop that served the app — a PostgreSQL
    pool or a Redis client belongs to the event loop that first used it).
    With ``owns_memory=True`` the app's lifespan closes it at shutdown, on
    the serving loop; ``flowmem serve`` does so.
    """
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        sweeper = (None if settings.sweep_interval is None else asyncio.create_task(
            sweep_forever(memory, settings.sweep_interval, settings.sweep_batch,
                          server.sessions)))
        try:
            yield
        finally:
            if sweeper is not None:
                sweeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sweeper
            await server.tokens.flush()
            await server.changes.aclose()
            if owns_memory:
                await memory.aclose()

    app = FastAPI(title="flowmem", version=__version__, docs_url=None, redoc_url=None,
                  default_response_class=AsciiJSONResponse, responses=ERROR_RESPONSES,
                  dependencies=[Depends(strict_query)], redirect_slashes=False,
                  lifespan=lifespan, **_telemetry(settings.otel))
    changes = Changes(memory.store)
    server = ServerState(memory=memory, tokens=TokenBackend(memory.store, changes),
                         sessions=SessionRegistry(memory.store, changes,
                                                  retention=memory.retention,
                                                  clock=memory.clock),
                         settings=settings,
                         limiter=RateLimiter(settings.rate_limit, settings.burst),
                         changes=changes, writers=WriterRecords(memory.store))
    app.state.flowmem = server
    for module in (routes_meta, routes_sessions, routes_events, routes_memory, routes_compact,
                   routes_users,
                   routes_ui):
        app.include_router(module.router)
    _install_handlers(app)
    app.openapi = lambda: _openapi(app, settings)  # type: ignore[method-assign]
    if settings.fast_turns:  # innermost: behind every gate below
        app.add_middleware(TurnsFastPath, failure=_flowmem_failure)
    app.add_middleware(BodyGate, limits=settings.limits, read_timeout=settings.read_timeout,
                       admit=lambda scope: admit(server, scope))
    app.add_middleware(Failures)
    app.add_middleware(HostGate, allowed=settings.allowed_hosts)
    metrics_http.install(app)  # last: outermost, so every answer is counted
    return app
