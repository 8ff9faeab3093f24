"""The hot door without FastAPI's per-request plumbing: ``POST /v1/sessions/{id}/turns``.

Profiled on the 2-core machine, FastAPI's routing and dependency solving
took about half of the CPU of an append turn — more than the append itself.
:class:`TurnsFastPath` (ASGI middleware, innermost: inside the Host gate, the
body gate, the metrics and the generic failure) answers a well-formed turn
by calling the SAME functions the FastAPI route calls — the :func:`~.deps.caller`
and :func:`~.deps.identified` dependencies, then
:func:`~.routes_sessions.append_turn` itself — and turns an
:class:`~.responses.ApiError` or a :class:`~flowmem.errors.FlowmemError`
into the same refusal the app's handlers give.

Anything unusual goes to the FastAPI route untouched, before any side effect
(the token check, the rate limit): a query string, a repeated header, a body
that is not an object the :class:`~.models.TurnBody` model accepts, a root path. So every
refusal of a malformed request is the route's own, and the OpenAPI schema is
the route's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Final

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import FlowmemError
from ._deps import caller, identified
from ._gate import DOCUMENT, replay_body
from ._models import TurnBody
from ._responses import ApiError, error_response
from ._routes_sessions import append_turn

__all__ = ["TURNS_PATH", "TurnsFastPath"]

TURNS_PATH: Final = re.compile(r"/v1/sessions/([^/]+)/turns")
_ONCE: Final = (b"authorization", b"idempotency-key", b"prefer")


def _api_error(exc: ApiError) -> Response:
    return error_response(exc.code, exc.message, details=exc.details, headers=exc.headers)


class TurnsFastPath:
    """ASGI middleware: serve a well-formed append turn directly (see the module notes)."""

    def __init__(self, app: ASGIApp, failure: Callable[[FlowmemError], Response]) -> None:
        self.app = app
        self.failure = failure

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = (TURNS_PATH.fullmatch(scope["path"]) if scope["type"] == "http"
                 and scope["method"] == "POST" and not scope.get("query_string")
                 and not scope.get("root_path") else None)
        if found is None or not _single_headers(scope):
            await self.app(scope, receive, send)
            return
        raw = await _body(receive)
        body = _turn(scope.get(DOCUMENT, raw))
        if body is None:
            await self.app(scope, replay_body(raw, receive), send)
            return
        request = Request(scope, receive)
        response: Response
        try:
            principal = await identified(await caller(request, None))
            response = await append_turn(found.group(1), body, principal,
                                         request.app.state.flowmem,
                                         request.headers.get("idempotency-key"),
                                         request.headers.get("prefer"))
        except ApiError as exc:
            response = _api_error(exc)
        except FlowmemError as exc:
            response = self.failure(exc)
        await response(scope, receive, send)


def _single_headers(scope: Scope) -> bool:
    """Whether each header the route reads came at most once (else the route decides)."""
    seen = [name for name, _ in scope["headers"] if name in _ONCE]
    return len(seen) == len(set(seen))


def _turn(raw: bytes | Any) -> TurnBody | None:
    """The body (its bytes, or the document the gate parsed) as the route's model, or
    ``None`` to let the route refuse it."""
    document: Any = raw
    if isinstance(raw, bytes):
        try:
            document = json.loads(raw)
        except ValueError:
            return None
    if not isinstance(document, dict):
        return None
    try:
        return TurnBody.model_validate(document)
    except ValidationError:
        return None


async def _body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)

