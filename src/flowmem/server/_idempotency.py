"""``Idempotency-Key`` on the doors that change memory (#10): retries that are safe.

A client that lost the answer to ``POST /v1/memory/append|write|delete`` or
``POST /v1/sessions/{id}/turns`` sends the same request again with the same
``Idempotency-Key`` header. The key reaches the coordinator as
``idempotency_key=`` (namespaced by a digest of the caller, so two callers' keys
never meet), and the store records it in the transaction of the change itself: a
repeat changes nothing and answers the first call's outcome (``count``,
``appended``, ``found``) with ``Idempotent-Replayed: true``; a repeat with a
different body answers 422 ``idempotency_key_reused``. That holds even when
the server died after committing and before answering. The echoed messages of
a replayed append are the conversation as it is now. Keys live 24 h.
"""

from __future__ import annotations

import hashlib
import re
from typing import Annotated, Final

from fastapi import Header

from ..access import Principal
from ._responses import ApiError, AsciiJSONResponse

__all__ = ["REPLAYED_HEADER", "IdempotencyHeader", "mark_replayed", "memory_key"]

REPLAYED_HEADER: Final = "Idempotent-Replayed"
_KEY: Final = re.compile(r"[\x21-\x7e]{1,255}")

IdempotencyHeader = Annotated[
    str | None,
    Header(alias="Idempotency-Key",
           description="Retry safely: the same key with the same request changes nothing "
                       "and answers the first outcome; 1-255 visible ASCII characters."),
]


def memory_key(principal: Principal, header: str | None) -> str | None:
    """The coordinator's idempotency key for this caller's header (``None`` without one)."""
    if header is None:
        return None
    if not _KEY.fullmatch(header):
        raise ApiError("invalid_field", "Idempotency-Key must be 1-255 visible ASCII characters",
                       details=[{"code": "invalid_header", "message": "Idempotency-Key",
                                 "locator": "header.Idempotency-Key"}])
    # the caller by a digest, never by name: an erased user's id is in no record
    who = hashlib.sha256((principal.user_id or "-").encode("utf-8", "surrogatepass"))
    return f"http:{who.hexdigest()[:16]}:{header}"


def mark_replayed(response: AsciiJSONResponse, replayed: bool) -> AsciiJSONResponse:
    """Say on the response that it replays a first call's outcome."""
    if replayed:
        response.headers[REPLAYED_HEADER] = "true"
    return response
