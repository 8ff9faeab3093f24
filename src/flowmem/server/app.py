"""``create_app(memory, settings)``: the storage API of GR-MEM over HTTP.

A thin layer over :class:`~flowmem.Memory` and the store: authentication
(:mod:`.auth`), the access rules (:mod:`flowmem.access`, MEM-8/9/15), the
session registry (:mod:`.sessions`) and the limits (:mod:`.limits`). Errors
map to one envelope: invalid input 400 (never 422, never 5xx), bad token
401, denied 403, unknown or invisible session 404, key conflict or stopped
session 409, body too large 413, store failure 503.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from starlette.exceptions import HTTPException
from starlette.responses import Response

from .. import __version__
from ..errors import FlowmemError, InvalidInput, KeyConflict, StoreError
from ..memory import Memory
from . import routes_memory, routes_meta, routes_sessions
from .auth import TokenBackend
from .deps import ServerState, strict_query
from .limits import BodyLimits
from .responses import ERROR_RESPONSES, ApiError, AsciiJSONResponse, ErrorBody, error_response
from .sessions import SessionRegistry
from .settings import Settings

__all__ = ["create_app"]

logger = logging.getLogger("flowmem")

_DESCRIPTION = """\
Conversation memory for LLM agent workflows (the GR-MEM rules, storage-api profile).

**Authentication**: `Authorization: Bearer <token>` (`flowmem token create --user ID`).
Without it the caller is anonymous: no identity, owns nothing.

**Refusals (MEM-7)**: a memory operation under a refused scope (`user` without a real
user, `session` without a session) answers **200** with the neutral result and
`refused: true` — a read `found: false` with the default, a write or delete `ok: false`,
an append `count: 0` and no messages; `resolved_scope_id` is `""`. Nothing is stored.

**Access (MEM-8, MEM-9, MEM-15)**: a session the caller may not view answers 404; an
action it may see but not do answers 403. Viewers never drive; messages are edited by
admins only; hooks only add denials.

**Limits**: body {body} bytes (413), JSON nesting depth {depth} (400), {messages} messages
per append (400), {content} characters of content per message (400), unknown fields (400).
"""


def _validation_detail(exc: RequestValidationError) -> list[dict[str, Any]]:
    return [{"loc": [str(part) for part in err.get("loc", ())], "msg": str(err.get("msg", "")),
             "type": str(err.get("type", ""))} for err in exc.errors()]


def _install_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> Response:
        return error_response(exc.status, exc.code, exc.message, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> Response:
        detail = _validation_detail(exc)
        first = detail[0] if detail else {"loc": [], "msg": "invalid request"}
        where = ".".join(first["loc"])
        message = f"{where}: {first['msg']}" if where else str(first["msg"])
        return error_response(400, "invalid_request", message, detail=detail)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> Response:
        status = 400 if exc.status_code == 422 else exc.status_code
        code = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed"}.get(
            status, "error")
        headers = dict(exc.headers) if exc.headers else None
        return error_response(status, code, str(exc.detail), headers=headers)

    @app.exception_handler(FlowmemError)
    async def flowmem_error(_: Request, exc: FlowmemError) -> Response:
        if isinstance(exc, KeyConflict):
            return error_response(409, "conflict", str(exc))
        if isinstance(exc, InvalidInput):
            return error_response(400, "invalid_request", str(exc))
        if isinstance(exc, StoreError):
            logger.error("flowmem: store error: %s", exc)
            return error_response(503, "store_unavailable", str(exc))
        return error_response(400, "invalid_request", str(exc))


def _openapi(app: FastAPI, settings: Settings) -> dict[str, Any]:
    if app.openapi_schema is not None:
        return app.openapi_schema
    limits = settings.limits
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes,
                         description=_DESCRIPTION.format(
                             body=limits.max_body_bytes, depth=limits.max_json_depth,
                             messages=limits.max_messages_per_append,
                             content=limits.max_content_chars))
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    components["Error"] = ErrorBody
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            operation.get("responses", {}).pop("422", None)
            # The token is optional (anonymous callers) unless the operation needs an identity.
            if operation.get("security") and not operation.pop("x-requires-identity", False):
                operation["security"] = [*operation["security"], {}]
    app.openapi_schema = schema
    return schema


def create_app(memory: Memory, settings: Settings | None = None) -> FastAPI:
    """The ASGI app serving ``memory`` (see the module notes and ``docs/http.md``)."""
    settings = settings or Settings()
    app = FastAPI(title="flowmem", version=__version__, docs_url=None, redoc_url=None,
                  default_response_class=AsciiJSONResponse, responses=ERROR_RESPONSES,
                  dependencies=[Depends(strict_query)])
    app.state.flowmem = ServerState(memory=memory, tokens=TokenBackend(memory.store),
                                    sessions=SessionRegistry(memory.store), settings=settings)
    for module in (routes_meta, routes_sessions, routes_memory):
        app.include_router(module.router)
    _install_handlers(app)
    app.openapi = lambda: _openapi(app, settings)  # type: ignore[method-assign]
    app.add_middleware(BodyLimits, limits=settings.limits)
    return app
