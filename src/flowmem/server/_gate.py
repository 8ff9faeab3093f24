"""ASGI gates every request passes before any route: Host, failures, the body gate.

- :class:`BodyGate` is the ONE body gate of every JSON door (STORE-1,
  API-1). A present body must arrive within the read deadline, be at most
  8 MiB, be sent as JSON, decode as UTF-8 JSON whose top level is an object
  or an array, nest at most 63 levels, and hold only finite numbers; every
  refusal is 400 in the refusal envelope, before any field is read. An
  absent body of a POST/PUT/PATCH is read as ``{}`` and gated like any
  other ("optional never means unvalidated"). A body sent to a ``/v1/``
  door is not read at all before the caller's token is known valid (401
  first). The checks run on the raw bytes first (size, then depth: one
  linear pass in C), so a hostile body never reaches a recursive parser; a
  large body is checked and parsed in a worker thread, and the routes use
  the parsed document (``scope[DOCUMENT]``) instead of parsing it again.
- :class:`HostGate` answers only to the allowed ``Host`` names (DNS
  rebinding against a loopback service), and only to a request that names
  one ``Host``.
- :class:`Failures` turns what no handler classified into the generic 500
  (one fixed message and a request id; the cause goes to the log, API-7).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import uuid
from collections.abc import Awaitable, Callable, Collection
from typing import Any, Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._limits import Limits
from ._responses import ApiError, error_response

__all__ = ["DOCUMENT", "Admit", "BodyGate", "Failures", "HostGate", "gate_document", "gate_error",
           "json_depth_error", "new_request_id", "replay_body"]

logger = logging.getLogger("flowmem")

_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS: Final = b"[]{}"
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in _BRACKETS)
_JSON_TYPE: Final = re.compile(r"^application/(?:[\w.+-]+\+)?json\s*(?:;.*)?$", re.I)
_WITH_BODY: Final = frozenset({"POST", "PUT", "PATCH"})
GENERIC_MESSAGE: Final = "internal error; the cause is logged under this request id"


def new_request_id() -> str:
    """A fresh id tying a generic failure's body to its log line."""
    return uuid.uuid4().hex[:16]


def _depth_pattern(max_depth: int) -> re.Pattern[bytes]:
    """A regex matching exactly the bracket skeletons nested at most ``max_depth`` deep.

    ``L0`` is empty; ``Lk`` is ``(?:\\(Lk-1\\))*+``: its text grows linearly with the
    depth, and its quantifiers are possessive, so the engine never backtracks: one
    pass over the skeleton, each byte looked at once.
    """
    pattern = b""
    for _ in range(max_depth):
        pattern = rb"(?:\(" + pattern + rb"\))*+"
    return re.compile(pattern)


_DEPTH_PATTERNS: Final[dict[int, re.Pattern[bytes]]] = {}
_OPEN_CLOSE: Final = bytes.maketrans(b"[{]}", b"(())")


def json_depth_error(body: bytes, max_depth: int) -> str | None:
    """Why ``body`` nests deeper than ``max_depth`` containers, or ``None``.

    Linear in the size of the body, whatever its depth, and every step runs in
    C: strings are removed (brackets inside them do not nest), everything but
    brackets is deleted, openers and closers are mapped to ``(`` and ``)``, and
    one possessive regex (:func:`_depth_pattern`) matches the skeleton in one
    pass. A skeleton it does not match either nests too deep or is unbalanced
    (which the JSON parser refuses anyway).
    """
    skeleton = _STRING.sub(b"", body).translate(_OPEN_CLOSE, _NOT_BRACKETS)
    if not skeleton:
        return None
    pattern = _DEPTH_PATTERNS.get(max_depth)
    if pattern is None:
        pattern = _DEPTH_PATTERNS.setdefault(max_depth, _depth_pattern(max_depth))
    if pattern.fullmatch(skeleton) is not None:
        return None
    if skeleton.count(b"(") == skeleton.count(b")"):
        return f"the body nests deeper than {max_depth} levels"
    return None  # unbalanced: the parser refuses it as not JSON


class _BadNumber(ValueError):
    pass


class _TooLarge(Exception):
    pass


def _constant(name: str) -> Any:
    raise _BadNumber(f"the body holds {name}, which is not a JSON number")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise _BadNumber(f"the body holds the number {text[:40]!r}, which is not finite")
    return number


def gate_document(body: bytes, content_type: str | None,
                  limits: Limits) -> tuple[tuple[str, str] | None, Any]:
    """The gate's refusal of a present body as ``(code, message)``, or ``None`` and the
    parsed document (STORE-1)."""
    if len(body) > limits.max_body_bytes:
        return ("body_too_large", f"the body is larger than {limits.max_body_bytes} bytes"), None
    if content_type is None or not _JSON_TYPE.match(content_type):
        return ("body_not_json", "the body must be sent as Content-Type: application/json"), None
    problem = json_depth_error(body, limits.max_json_depth)
    if problem is not None:
        return ("body_too_deep", problem), None
    try:
        document = json.loads(body.decode("utf-8"), parse_constant=_constant,
                              parse_float=_finite)
    except _BadNumber as exc:
        return ("body_bad_number", str(exc)), None
    except UnicodeDecodeError:
        return ("body_not_json", "the body is not UTF-8"), None
    except ValueError as exc:
        if "digits" in str(exc):  # an integer longer than Python converts
            return ("body_bad_number", "the body holds a number too long to convert"), None
        return ("body_not_json", f"the body is not JSON: {str(exc)[:120]}"), None
    except RecursionError:  # pragma: no cover - the depth check runs first
        return ("body_too_deep", "the body nests too deep"), None
    if not isinstance(document, dict | list):
        return ("body_not_container", "the body's top level must be an object or an array"), None
    return None, document


def gate_error(body: bytes, content_type: str | None, limits: Limits) -> tuple[str, str] | None:
    """The gate's refusal of a present body as ``(code, message)``, or ``None`` (STORE-1)."""
    return gate_document(body, content_type, limits)[0]


Admit = Callable[[Scope], Awaitable[None]]
"""Checks a request's credentials before its body is read; raises :class:`ApiError`."""

DOCUMENT: Final = "flowmem.document"
"""The scope entry holding the body the gate parsed (the routes use it, never parse again)."""
OFFLOAD_BYTES: Final = 64 * 1024
"""Bodies larger than this are checked and parsed in a worker thread, off the event loop."""


def _carries_body(scope: Scope, headers: dict[bytes, bytes]) -> bool:
    if scope["method"] in _WITH_BODY or b"transfer-encoding" in headers:
        return True
    declared = headers.get(b"content-length", b"0")
    return not declared.isdigit() or int(declared) > 0


class BodyGate:
    """ASGI middleware: the one body gate (see the module notes).

    A request that carries a body to a ``/v1/`` door is admitted first
    (``admit``: its token is checked, 401 without a valid one), so not one byte
    of an unauthenticated body is read, let alone parsed.
    """

    def __init__(self, app: ASGIApp, limits: Limits, read_timeout: float,
                 admit: Admit | None = None) -> None:
        self.app = app
        self.limits = limits
        self.read_timeout = read_timeout
        self.admit = admit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > \
                self.limits.max_body_bytes:
            await self._refuse(scope, receive, send, "body_too_large",
                               f"the body is larger than {self.limits.max_body_bytes} bytes")
            return
        if self.admit is not None and scope["path"].startswith("/v1/") \
                and _carries_body(scope, headers):
            try:
                await self.admit(scope)
            except ApiError as exc:
                await error_response(exc.code, exc.message, details=exc.details,
                                     headers={**(exc.headers or {}), "Connection": "close"})(
                    scope, receive, send)
                return
        try:
            async with asyncio.timeout(self.read_timeout):  # no task per request (wait_for)
                body = await self._read(receive)
        except TimeoutError:
            await self._refuse(scope, receive, send, "body_not_json",
                               f"the body did not arrive within {self.read_timeout:g} s")
            return
        except _TooLarge:
            await self._refuse(scope, receive, send, "body_too_large",
                               f"the body is larger than {self.limits.max_body_bytes} bytes")
            return
        if body is None:
            return  # the client went away
        if not body and scope["method"] in _WITH_BODY:
            body = b"{}"
            scope = {**scope, DOCUMENT: {},
                     "headers": [*(h for h in scope["headers"] if h[0] != b"content-type"),
                                 (b"content-type", b"application/json")]}
        elif body:
            raw_type = headers.get(b"content-type")
            content_type = raw_type.decode("latin-1") if raw_type else None
            if len(body) > OFFLOAD_BYTES:
                refusal, document = await asyncio.to_thread(gate_document, body, content_type,
                                                            self.limits)
            else:
                refusal, document = gate_document(body, content_type, self.limits)
            if refusal is not None:
                await self._refuse(scope, receive, send, *refusal)
                return
            scope = {**scope, DOCUMENT: document}
        await self.app(scope, replay_body(body, receive), send)

    async def _read(self, receive: Receive) -> bytes | None:
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limits.max_body_bytes:
                raise _TooLarge
            chunks.append(chunk)
            more = message.get("more_body", False)
        return b"".join(chunks)

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, code: str,
                      message: str) -> None:
        response = error_response(code, message, headers={"Connection": "close"})
        await response(scope, receive, send)


def replay_body(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands out ``body`` (already read) once, then the rest."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _host_name(host: str) -> str:
    """``Host`` without its port, lower case (``[::1]:8080`` -> ``[::1]``)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host.partition("]")[0] + "]"
    return host.rpartition(":")[0] if host.count(":") == 1 else host


class HostGate:
    """ASGI middleware: refuse a ``Host`` not in ``allowed`` (400 ``host_not_allowed``) and
    a request naming its ``Host`` more than once (400 ``host_repeated``: which one a proxy
    or a route would believe is anyone's guess). ``allowed=None``: any single name."""

    def __init__(self, app: ASGIApp, allowed: Collection[str] | None) -> None:
        self.app = app
        self.allowed = None if allowed is None else frozenset(h.lower() for h in allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            hosts = [value for name, value in scope.get("headers") or () if name == b"host"]
            if len(hosts) > 1:
                await error_response("host_repeated", "the request names its Host more than "
                                     "once")(scope, receive, send)
                return
            raw = hosts[0].decode("latin-1") if hosts else ""
            if self.allowed is not None and _host_name(raw) not in self.allowed:
                await error_response("host_not_allowed",
                                     "this service does not answer to that Host header")(
                    scope, receive, send)
                return
        await self.app(scope, receive, send)


class Failures:
    """ASGI middleware: an exception no handler classified becomes the generic 500.

    The body carries one fixed message and a request id; the cause is logged
    with the same id and never reaches the body (API-7).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        except Exception:
            request_id = new_request_id()
            logger.exception("flowmem: request %s (%s %s) failed", request_id,
                             scope.get("method"), scope.get("path"))
            if not started:
                await error_response("internal_error", GENERIC_MESSAGE,
                                     request_id=request_id)(scope, receive, send)
