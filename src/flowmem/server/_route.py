"""The routes of the JSON doors read the document the body gate already parsed.

:class:`GatedRoute` (an ``APIRoute``) hands FastAPI a request whose
``json()`` is the body gate's document (``scope[DOCUMENT]``), so a body is
parsed once, by the gate — in a worker thread when it is large — never a
second time on the event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from ._gate import DOCUMENT

__all__ = ["GatedRequest", "GatedRoute"]


class GatedRequest(Request):
    """A request whose JSON body is the gate's parsed document when there is one."""

    async def json(self) -> Any:
        if DOCUMENT in self.scope:
            return self.scope[DOCUMENT]
        return await super().json()


class GatedRoute(APIRoute):
    """An ``APIRoute`` whose handler sees a :class:`GatedRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def gated(request: Request) -> Response:
            return await handler(GatedRequest(request.scope, request.receive))

        return gated
