"""JSON responses and the one error envelope of the HTTP service.

Every response body is JSON encoded with ``ensure_ascii=True``: stored
content may hold lone surrogates, which UTF-8 cannot encode, so escaping
every non-ASCII code point is the only encoding that never fails.
"""

from __future__ import annotations

import json
from typing import Any, Final

from starlette.responses import JSONResponse

__all__ = ["ERROR_RESPONSES", "ApiError", "AsciiJSONResponse", "ErrorBody", "error_response"]


class AsciiJSONResponse(JSONResponse):
    """``application/json`` with every non-ASCII code point escaped."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False,
                          separators=(",", ":")).encode("ascii")


class ApiError(Exception):
    """An error the service answers on purpose: status, code, message."""

    def __init__(self, status: int, code: str, message: str,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers


def error_response(status: int, code: str, message: str, *,
                   detail: list[dict[str, Any]] | None = None,
                   headers: dict[str, str] | None = None) -> AsciiJSONResponse:
    """The error envelope: ``{"error": code, "message": text[, "detail": [...]]}``."""
    body: dict[str, Any] = {"error": code, "message": message}
    if detail is not None:
        body["detail"] = detail
    return AsciiJSONResponse(body, status_code=status, headers=headers)


ErrorBody: Final[dict[str, Any]] = {
    "type": "object",
    "required": ["error", "message"],
    "properties": {
        "error": {"type": "string", "description": "A stable machine-readable code."},
        "message": {"type": "string", "description": "What went wrong, for a human."},
        "detail": {"type": "array", "items": {"type": "object"},
                   "description": "Per-field validation errors (400 only)."},
    },
}
"""The JSON schema of the error envelope (documented on every operation)."""


def _error(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


ERROR_RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    400: _error("Invalid request: malformed JSON, unknown field, nesting deeper than the "
                "limit, too many messages, content too long, invalid message or value "
                "(`invalid_request`)."),
    401: _error("A bearer token was sent but is not valid, or the operation needs an "
                "identity (`unauthenticated`)."),
    403: _error("The caller may see the session but the access rules deny the action "
                "(`forbidden`): MEM-9 (viewers never drive) and MEM-15 (messages are "
                "immutable below the admin tier; hooks only add denials)."),
    404: _error("No such session, or one the caller may not view (`not_found`): a "
                "refusal never reveals whether a foreign session exists."),
    409: _error("Conflict (`conflict`): the key holds the other kind of data, or the "
                "session is stopped."),
    413: _error("The request body is larger than the limit (`payload_too_large`)."),
    503: _error("The storage backend failed or stayed busy (`store_unavailable`)."),
}
"""The error statuses every operation documents in ``/openapi.json``."""
