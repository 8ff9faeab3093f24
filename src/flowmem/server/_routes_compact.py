"""Compaction over HTTP: ``POST /v1/memory/compact``, the administrative tier only.

Compaction (:meth:`flowmem.AsyncMemory.compact`) replaces everything older
than a kept tail by ONE summary message: an edit of stored messages, so it
is for admins only (MEM-15). The request first passes the checks of any
write (:func:`.guard.memory_context`: a session must be visible — else 404 —
drivable and not stopped; a shared scope needs its grant); then anyone but
an admin gets 403 ``messages_immutable``. A refused scope is the neutral
MEM-7 result.

The service runs no model: the request carries the ``summary`` text. It
replaces exactly the range the compaction decides when the request runs
(the answer says which: ``first``, ``last``, ``replaced``); the edit is
optimistic, once: if the range changes while it is written (an append
answering a call inside it, an edit), 409 ``compaction_conflict`` and
nothing changed. ``Idempotency-Key``: a repeat finds the summary it wrote
and answers it again (``replayed``), writing nothing.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import Field, StrictInt

from ..access import Level
from ..context import CompactionConflict
from ._budget_fields import CounterField
from ._budgets import counter_for
from ._deps import Identified, Server
from ._guard import memory_context
from ._idempotency import IdempotencyHeader, mark_replayed, memory_key
from ._limits import Limits
from ._models import Format, ScopedBody
from ._response_models import Ok, _Where
from ._responses import ApiError, AsciiJSONResponse, ok
from ._route import GatedRoute

__all__ = ["CompactBody", "CompactOut", "router"]

router = APIRouter(prefix="/v1/memory", tags=["memory"], route_class=GatedRoute)
_DEFAULTS = Limits()
Kept = Annotated[StrictInt | None, Field(ge=0, le=2**31 - 1)]


class CompactBody(ScopedBody):
    """Replace everything older than a kept tail by one summary (admin only, MEM-15)."""

    keep_last: Kept = Field(None, description="Keep at least the newest this many messages.")
    keep_last_tokens: Annotated[StrictInt | None, Field(
        ge=0, le=_DEFAULTS.max_budget_tokens,
        description="Keep the longest tail within this many tokens (counted as a budgeted "
                    "read counts, in `format`).")] = None
    counter: CounterField = None
    format: Format = "canonical"
    summary: Annotated[str, Field(
        min_length=1, max_length=_DEFAULTS.max_content_chars,
        description="The summary's text (a system message placed where the replaced "
                    "messages began, with `metadata.compacted`).")]


class CompactOut(_Where):
    """A compaction: ``replaced`` messages became the ``summary`` at ``position``
    (``first``..``last``); ``count`` is the conversation's length after it.
    Nothing to compact: ``replaced`` 0 and no summary."""

    replaced: int
    position: int | None
    first: int | None
    last: int | None
    count: int | None
    replayed: bool
    summary: dict[str, Any] | None


@router.post("/compact", response_model=Ok[CompactOut],
             summary="Replace all older than a kept tail by one summary (admin only, MEM-15)")
async def compact(body: CompactBody, principal: Identified, server: Server,
                  idempotency: IdempotencyHeader = None) -> AsciiJSONResponse:
    if (body.keep_last is None) == (body.keep_last_tokens is None):
        raise ApiError("invalid_field", "give exactly one of keep_last and keep_last_tokens",
                       details=[{"code": "conflicting_fields",
                                 "message": "keep_last or keep_last_tokens",
                                 "locator": "body.keep_last"}])
    if body.keep_last_tokens is not None \
            and body.keep_last_tokens > server.settings.limits.max_budget_tokens:
        raise ApiError("invalid_field", f"keep_last_tokens: at most "
                       f"{server.settings.limits.max_budget_tokens}",
                       details=[{"code": "less_than_equal", "message": "over the limit",
                                 "locator": "body.keep_last_tokens"}])
    counter = counter_for(body.counter or "approximate", "body.counter")
    key = memory_key(principal, idempotency)
    context = await memory_context(server, principal, body, Level.WRITE, erases=True)
    if not principal.admin:  # after the write's checks: absence before denial (404 first)
        raise ApiError("messages_immutable",
                       "compaction edits stored messages: the administrative tier only (MEM-15)")
    text = body.summary
    try:
        result = await server.memory.compact(
            body.scope, body.key, context=context, summarize=lambda _: text,
            keep_last=body.keep_last, keep_last_tokens=body.keep_last_tokens,
            counter=counter, format=body.format, idempotency_key=key, attempts=1)
    except CompactionConflict as exc:
        raise ApiError("compaction_conflict", str(exc)) from None
    spec = (result.summary or {}).get("metadata", {}).get("compacted", {})
    return mark_replayed(ok({
        "scope": body.scope, "resolved_scope_id": result.resolved_scope_id,
        "refused": result.refused, "replaced": result.replaced, "position": result.position,
        "first": spec.get("first"), "last": spec.get("last"), "count": result.count,
        "replayed": result.replayed, "summary": result.summary}), result.replayed)
