"""Request limits: body size (413), JSON nesting depth, messages and content (400).

The body limits are checked by an ASGI middleware on the raw bytes, BEFORE
any JSON parser runs, so a hostile body (a megabyte of ``[``) is refused
with a 400 or 413 and never reaches a recursive parser (no 500).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .responses import ApiError, error_response

__all__ = ["BodyLimits", "Limits", "check_messages", "json_depth_error"]

_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_PAIR: Final = re.compile(rb"\[\]|\{\}")
_BRACKETS: Final = b"[]{}"
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in _BRACKETS)


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits one app enforces (all documented in ``/openapi.json``).

    The schema also caps ``messages`` at the default of 100 per append, so
    ``max_messages_per_append`` can lower that limit, not raise it.
    """

    max_body_bytes: int = 1_048_576
    max_json_depth: int = 32
    max_messages_per_append: int = 100
    max_content_chars: int = 65_536


def json_depth_error(body: bytes, max_depth: int) -> str | None:
    """Why ``body`` nests deeper than ``max_depth`` containers, or ``None``.

    Strings are removed first (brackets inside them do not nest); then the
    innermost ``[]``/``{}`` pairs are removed ``max_depth`` times. Whatever
    bracket is left nests deeper than the limit (or is unbalanced, which the
    JSON parser refuses anyway). Every pass runs in C: linear and bounded.
    """
    skeleton = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    too_deep = re.compile(rb"[\[{]{%d}" % (max_depth + 1))
    for _ in range(max_depth):
        if not skeleton:
            return None
        if too_deep.search(skeleton):  # a run of openers nests too deep: no need to pair
            return f"JSON nested deeper than {max_depth} levels"
        reduced = _PAIR.sub(b"", skeleton)
        if reduced == skeleton:
            break
        skeleton = reduced
    if not skeleton:
        return None
    balanced = (skeleton.count(b"[") == skeleton.count(b"]")
                and skeleton.count(b"{") == skeleton.count(b"}"))
    if balanced and _PAIR.search(skeleton):
        return f"JSON nested deeper than {max_depth} levels"
    return "malformed JSON: unbalanced brackets"


class BodyLimits:
    """ASGI middleware: refuses a body over the size limit (413) or too deep (400).

    The body is read once, checked, and replayed to the application.
    """

    def __init__(self, app: ASGIApp, limits: Limits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limits.max_body_bytes
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._too_large(scope, receive, send)
            return
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await self._too_large(scope, receive, send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        problem = json_depth_error(body, self.limits.max_json_depth) if body else None
        if problem is not None:
            await error_response(400, "invalid_request", problem)(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(
            413, "payload_too_large",
            f"request body larger than {self.limits.max_body_bytes} bytes")
        await response(scope, receive, send)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _content_chars(content: Any) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content)
    try:
        return len(json.dumps(content, ensure_ascii=False))
    except (TypeError, ValueError):
        return 0


def check_messages(messages: Sequence[Any], limits: Limits) -> None:
    """Messages per append and content length (400 with the offending index)."""
    if len(messages) > limits.max_messages_per_append:
        raise ApiError(400, "invalid_request",
                       f"at most {limits.max_messages_per_append} messages per append, "
                       f"got {len(messages)}")
    for index, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        chars = _content_chars(content)
        if chars > limits.max_content_chars:
            raise ApiError(400, "invalid_request",
                           f"messages[{index}].content: {chars} characters, more than the "
                           f"limit of {limits.max_content_chars}")
