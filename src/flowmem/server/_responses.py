"""The three envelopes of the HTTP service and its published error codes.

Every JSON response is one of (API-5, API-8, the storage-api profile):

- a result: ``{"success": true, "data": ...}``;
- a paged result: ``{"success": true, "data": ..., "pagination": {"total",
  "limit", "offset", "has_more"}}`` — the block is built by :func:`pagination`
  and nowhere else;
- a refusal: ``{"success": false, "error": text, "error_code": code}``, plus
  ``details: [{code, message, locator}]`` where fields are named and
  ``request_id`` where the cause went to the log.

:data:`ERROR_CODES` is the one table of codes: each has one status and one
definition, never changes meaning and is never reused. ``docs/http.md``
publishes it (a test keeps the two equal).

Every body is JSON encoded with ``ensure_ascii=True``: stored content may
hold lone surrogates, which UTF-8 cannot encode. A value may be given as
:class:`Encoded` JSON text (a page of messages as the store holds them),
which is put into the body as it is instead of being decoded and encoded
again: half the CPU of an append turn's echo.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final

from starlette.responses import JSONResponse

__all__ = [
    "ERROR_CODES",
    "ERROR_RESPONSES",
    "MAX_PAGE",
    "ApiError",
    "AsciiJSONResponse",
    "Encoded",
    "ErrorBody",
    "ascii_json",
    "clamp_page",
    "error_response",
    "ok",
    "paged",
    "pagination",
]

MAX_PAGE: Final = 100
"""API-6: ``limit`` is capped at 100."""

ERROR_CODES: Final[dict[str, tuple[int, str]]] = {
    # the body gate (STORE-1, API-1): every JSON door, before any field is read
    "body_not_json": (400, "The body is empty where one is required, not JSON, not UTF-8, or "
                           "not sent as application/json."),
    "body_not_container": (400, "The body's top level is not an object or an array."),
    "body_too_large": (400, "The body is larger than 8 MiB."),
    "body_too_deep": (400, "The body nests 64 levels or deeper."),
    "body_bad_number": (400, "The body holds a number that is not finite (NaN, Infinity, "
                             "1e999) or too long to be a number."),
    # the door's own checks, after the gate
    "invalid_field": (400, "A field or query parameter is missing, unknown, or of the wrong "
                           "type or range (`details` names each)."),
    "invalid_message": (400, "A message the append rules refuse (MEM-1..14)."),
    "invalid_value": (400, "A memory value that is not storable JSON."),
    "invalid_input": (400, "An input the coordinator refuses: a key, a scope, a window or a "
                           "cursor it cannot use."),
    "too_many_messages": (400, "More messages in one append than the limit."),
    "message_too_large": (400, "A message (content, metadata and every other field) over the "
                               "byte or character limit."),
    "value_too_large": (400, "A memory value over the byte limit."),
    "host_not_allowed": (400, "The Host header is not one the service answers to."),
    "host_repeated": (400, "The request has more than one Host header."),
    # who calls
    "unauthenticated": (401, "No bearer token where one is needed."),
    "invalid_token": (401, "The bearer token is malformed, unknown, revoked or expired."),
    # what the caller may do
    "forbidden": (403, "The caller may see the session but the access rules deny the action "
                       "(MEM-9, MEM-15, a hook)."),
    "scope_forbidden": (403, "The token has no grant for this shared scope at this level."),
    "messages_immutable": (403, "Evicting, overwriting or deleting a session's messages, or "
                                "compacting a conversation, is for the administrative tier "
                                "only (MEM-15)."),
    # what exists
    "session_not_found": (404, "No such session, or one the caller may not see."),
    "message_not_found": (404, "No message at that position."),
    "route_not_found": (404, "No such route."),
    "method_not_allowed": (405, "The route does not take this method."),
    # state
    "session_stopped": (409, "The session is stopped: reset it to write again."),
    "key_conflict": (409, "The key holds a plain value where a conversation was expected, or "
                          "the reverse."),
    "compaction_conflict": (409, "The range a compaction was replacing changed while it was "
                                 "written; nothing changed."),
    "read_too_large": (409, "The value is too large to answer whole: page a conversation with "
                            "POST /v1/memory/history."),
    "idempotency_key_reused": (422, "The Idempotency-Key was already used for a different "
                                    "request: a retry must repeat the first one exactly."),
    "rate_limited": (429, "Too many requests for this token: retry after `Retry-After` "
                          "seconds."),
    # failures
    "internal_error": (500, "A failure that cannot be attributed; the cause is logged under "
                            "`request_id`."),
    "store_failed": (503, "The store failed in a way it did not classify; nothing was changed; "
                          "the cause is logged under `request_id`."),
    "store_unavailable": (503, "The store cannot be reached; nothing was changed."),
    "outcome_unknown": (503, "The store lost the answer to a change: it may or may not have "
                             "been stored. Retry with the same Idempotency-Key (after "
                             "`Retry-After` seconds)."),
    "store_busy": (503, "The store stayed locked by other writers; nothing was changed; "
                        "retry."),
    "erasure_in_progress": (409, "The user's (or session's) memory is being erased: the "
                                 "key was not created, nothing was written; retry after "
                                 "`Retry-After` seconds."),
    "store_read_only": (503, "The store is open read-only (a read-only SQLite database); "
                             "nothing was changed."),
}
"""code -> (status, definition): the published table (``docs/http.md``)."""


class Encoded:
    """A value of an answer given as its JSON text, to be put into the body as it is.

    ``text`` must be compact, ASCII-only JSON (as the stores write message
    bodies); ``plain`` builds the same value as Python objects, for the rare
    answer that cannot be spliced (see :meth:`AsciiJSONResponse.render`).
    """

    __slots__ = ("plain", "text")

    def __init__(self, text: str, plain: Callable[[], Any]) -> None:
        self.text = text
        self.plain = plain


class AsciiJSONResponse(JSONResponse):
    """``application/json`` with every non-ASCII code point escaped."""

    def render(self, content: Any) -> bytes:
        return ascii_json(content).encode("ascii")


def ascii_json(content: Any) -> str:
    """``content`` as compact ASCII JSON, each :class:`Encoded` value spliced in as it is.

    Each is first written as a marker string and the marker's text replaced by
    the value's; a marker that shows up other than once (only a stored string
    equal to it could) sends the answer down the plain path instead.
    """
    held: list[Encoded] = []

    def hold(value: Any) -> str:
        if not isinstance(value, Encoded):
            raise TypeError(f"{type(value).__name__} is not JSON serializable")
        held.append(value)
        return f"\x00flowmem-encoded-{len(held) - 1}\x00"

    text = _encoder(hold).encode(content)
    for index, value in enumerate(held):
        marker = json.dumps(f"\x00flowmem-encoded-{index}\x00")
        if text.count(marker) != 1:
            return _encoder(lambda v: v.plain() if isinstance(v, Encoded) else hold(v)
                            ).encode(content)
        text = text.replace(marker, value.text)
    return text


def _encoder(default: Callable[[Any], Any]) -> json.JSONEncoder:
    return json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",", ":"),
                            default=default)


class ApiError(Exception):
    """A refusal the service answers on purpose; the status comes from the code's row."""

    def __init__(self, code: str, message: str, *, details: list[dict[str, Any]] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = ERROR_CODES[code][0]
        self.code = code
        self.message = message
        self.details = details
        self.headers = headers


def ok(data: Any, status: int = 200) -> AsciiJSONResponse:
    """The result envelope ``{"success": true, "data": data}``."""
    return AsciiJSONResponse({"success": True, "data": data}, status_code=status)


def clamp_page(limit: int | None, offset: int | None, default: int) -> tuple[int, int]:
    """API-6: ``limit`` in ``[1, 100]`` (absent: ``default``), ``offset`` floored at 0."""
    size = default if limit is None else limit
    return max(1, min(size, MAX_PAGE)), max(0, offset or 0)


def pagination(total: int, limit: int, offset: int) -> dict[str, Any]:
    """The ONE pagination block (API-5): exactly these four keys, in this order."""
    return {"total": total, "limit": limit, "offset": offset,
            "has_more": (offset + limit) < total}


def paged(data: Any, total: int, limit: int, offset: int) -> AsciiJSONResponse:
    """The paged envelope ``{"success": true, "data", "pagination"}``."""
    return AsciiJSONResponse({"success": True, "data": data,
                              "pagination": pagination(total, limit, offset)})


def error_response(code: str, message: str, *, details: list[dict[str, Any]] | None = None,
                   request_id: str | None = None,
                   headers: dict[str, str] | None = None) -> AsciiJSONResponse:
    """The refusal envelope for ``code`` (its status from :data:`ERROR_CODES`)."""
    body: dict[str, Any] = {"success": False, "error": message, "error_code": code}
    if details is not None:
        body["details"] = details
    if request_id is not None:
        body["request_id"] = request_id
    return AsciiJSONResponse(body, status_code=ERROR_CODES[code][0], headers=headers)


ErrorBody: Final[dict[str, Any]] = {
    "type": "object",
    "required": ["success", "error", "error_code"],
    "additionalProperties": False,
    "properties": {
        "success": {"type": "boolean", "enum": [False]},
        "error": {"type": "string", "description": "What went wrong, for a person."},
        "error_code": {"type": "string", "enum": sorted(ERROR_CODES),
                       "description": "The stable code (see the table in docs/http.md)."},
        "details": {"type": "array", "description": "One entry per named field.",
                    "items": {"type": "object", "required": ["code", "message", "locator"],
                              "additionalProperties": False,
                              "properties": {"code": {"type": "string"},
                                             "message": {"type": "string"},
                                             "locator": {"type": "string"}}}},
        "request_id": {"type": "string", "description": "Where the cause is in the log."},
    },
}
"""The JSON schema of the refusal envelope (documented on every operation)."""


def _error(status: int) -> dict[str, Any]:
    codes = [f"`{code}`" for code, (s, _) in ERROR_CODES.items() if s == status]
    return {"description": "Refused: " + ", ".join(codes) + ".",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


ERROR_RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    status: _error(status) for status in sorted({s for s, _ in ERROR_CODES.values()})
}
"""The refusal statuses every operation documents in ``/openapi.json``."""
