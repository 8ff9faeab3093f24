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

from ._responses import ApiError

__all__ = ["ASSETS", "FAVICON", "SECURITY_HEADERS", "router"]

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


FAVICON: Final = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32">'
    '<rect width="32" height="32" rx="7" fill="#101828"/>'
    '<path d="M8 10h16M8 16h12M8 22h8" stroke="#b692f6" stroke-width="3" '
    'stroke-linecap="round"/></svg>')
"""The page's icon: inline SVG, no file, no 404 for a browser's ``/favicon.ico``."""


@router.get("/favicon.ico")
async def favicon() -> Response:
    """The icon (SVG), for the page and for browsers that ask on their own."""
    return Response(FAVICON, media_type="image/svg+xml",
                    headers={**SECURITY_HEADERS, "Cache-Control": "max-age=86400"})


@router.get("/ui")
async def page() -> Response:
    """The transcript page."""
    return _asset("index.html")


@router.get("/ui/{asset}")
async def asset(asset: str) -> Response:
    """A script or stylesheet of the page."""
    return _asset(asset)
