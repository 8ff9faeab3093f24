"""``GET /ui``: the transcript page, from static files packaged with flowmem.

The page is plain HTML, CSS and JavaScript (no CDN, no build step): it asks
for a token, keeps it in ``sessionStorage`` and sends it as a bearer header
to the same ``/v1`` API any client uses — no cookie is ever set, so there is
no CSRF surface, and the page gets nothing the token could not get. The
files are public (they hold no data); every answer carries a strict Content
Security Policy (same-origin scripts, styles and requests only; no framing).
"""

from __future__ import annotations

from importlib import resources
from typing import Final

from fastapi import APIRouter
from starlette.responses import Response

from .responses import ApiError

__all__ = ["ASSETS", "SECURITY_HEADERS", "router"]

router = APIRouter(tags=["ui"], include_in_schema=False)

ASSETS: Final = {"app.js": "text/javascript; charset=utf-8",
                 "app.css": "text/css; charset=utf-8",
                 "index.html": "text/html; charset=utf-8"}
"""The files under ``flowmem/server/static`` and their media types."""

SECURITY_HEADERS: Final = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "connect-src 'self'; img-src 'self' data:; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}


def _asset(name: str) -> Response:
    if name not in ASSETS:
        raise ApiError("route_not_found", "no such route")
    body = resources.files("flowmem.server").joinpath("static", name).read_bytes()
    return Response(body, media_type=ASSETS[name], headers=SECURITY_HEADERS)


@router.get("/ui")
async def page() -> Response:
    """The transcript page."""
    return _asset("index.html")


@router.get("/ui/{asset}")
async def asset(asset: str) -> Response:
    """A script or stylesheet of the page."""
    return _asset(asset)
