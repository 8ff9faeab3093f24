"""Memory endpoints for a runtime: read, write, delete, append, history under a scope.

The execution ids come from the request; the user id from the token only.
Who may reach what is :func:`.guard.memory_context` (sessions need drive
rights, shared scopes need grants). Under a session the ``user`` scope is
the session OWNER, only when the owner is a real user — never whoever
drives (MEM-8) — and the ``session`` scope is that session.

A refused scope (MEM-6, MEM-13) answers the neutral MEM-7 result with
status 200 and ``refused: true``: a read ``found: false`` with the default,
a write or delete ``ok: false``, an append ``count: 0`` and no messages;
``resolved_scope_id`` is ``""``. Nothing reaches the store, and no fallback
bucket is ever used. The refusal itself is decided by
:meth:`flowmem.coordinator.MemoryCore._locate`, not here.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from ..access import SHARED_SCOPES, Level
from ..results import DeleteResult, HistoryResult, ReadResult, ScopedAppendResult, WriteResult
from ..scopes import ExecutionContext
from ._budgets import budget_answer, check_budget_knobs
from ._deps import (
    Caller,
    Server,
    ServerState,
    append_and_echo,
    history_page,
    incoming,
    positioned,
    rendered,
)
from ._guard import memory_context, stamp
from ._idempotency import IdempotencyHeader, mark_replayed, memory_key
from ._limits import check_value, json_bytes
from ._models import AppendBody, HistoryBody, ReadBody, ScopedBody, WriteBody
from ._prefer import PreferHeader, mark_minimal, wants_minimal
from ._response_models import AppendOut, DeleteOut, HistoryOut, Ok, Page, ReadOut, WriteOut
from ._responses import ApiError, AsciiJSONResponse, clamp_page, ok, paged
from ._route import GatedRoute

__all__ = ["router"]

router = APIRouter(prefix="/v1/memory", tags=["memory"], route_class=GatedRoute)


def _where(result: ReadResult | WriteResult | DeleteResult | ScopedAppendResult | HistoryResult,
           ) -> dict[str, Any]:
    return {"scope": result.scope, "resolved_scope_id": result.resolved_scope_id,
            "refused": result.refused}


@router.post("/read", response_model=Ok[ReadOut],
             summary="Read a key (refused scope: 200, found false, refused true)")
async def read(body: ReadBody, principal: Caller,
         server: Server) -> AsciiJSONResponse:
    context = await memory_context(server, principal, body, Level.READ)
    result = await server.memory.read(body.scope, body.key, context=context, default=body.default)
    limit = server.settings.limits.max_read_bytes
    if result.found and json_bytes(result.value) > limit:
        raise ApiError("read_too_large",
                       f"the value is larger than {limit} bytes: page a conversation with "
                       f"POST /v1/memory/history")
    writer = (await server.writers.of(body.scope, result.resolved_scope_id, body.key)
              if result.found else None)
    return ok({**_where(result), "value": result.value, "found": result.found,
               "written_by": writer})


@router.post("/write", response_model=Ok[WriteOut],
             summary="Write a key (refused scope: 200, ok false, refused true)")
async def write(body: WriteBody, principal: Caller, server: Server,
                idempotency: IdempotencyHeader = None) -> AsciiJSONResponse:
    check_value(body.value, server.settings.limits)
    context = await memory_context(server, principal, body, Level.WRITE, erases=True)
    result = await server.memory.write(body.scope, body.key, body.value, context=context,
                                       idempotency_key=memory_key(principal, idempotency),
                                       replace=body.replace)
    if result.ok and (not result.replayed
                      or await _still_written(server, body, context)):
        await server.writers.record(body.scope, result.resolved_scope_id, body.key, principal)
    return mark_replayed(ok({**_where(result), "ok": result.ok}), result.replayed)


async def _still_written(server: ServerState, body: WriteBody,
                         context: ExecutionContext) -> bool:
    """Whether a replayed write's value is still the key's: then its writer is recorded
    again (the first call may have died before recording it); else someone wrote since,
    and ``written_by`` names them."""
    now = await server.memory.read(body.scope, body.key, context=context)
    return now.found and now.value == body.value


@router.post("/delete", response_model=Ok[DeleteOut],
             summary="Delete a key (refused scope: 200, ok false, refused true)")
async def delete(body: ScopedBody, principal: Caller, server: Server,
                 idempotency: IdempotencyHeader = None) -> AsciiJSONResponse:
    context = await memory_context(server, principal, body, Level.WRITE, erases=True)
    result = await server.memory.delete(body.scope, body.key, context=context,
                                        idempotency_key=memory_key(principal, idempotency))
    if result.found:  # a replay too: the first call may have died before forgetting
        await server.writers.forget(body.scope, result.resolved_scope_id, body.key)
    return mark_replayed(ok({**_where(result), "ok": result.ok, "found": result.found}),
                         result.replayed)


@router.post("/append", response_model=Ok[AppendOut],
             summary="Append to a conversation, MEM-1..14 (refused scope: 200, count 0)")
async def append(body: AppendBody, principal: Caller, server: Server,
                 idempotency: IdempotencyHeader = None,
                 prefer: PreferHeader = None) -> AsciiJSONResponse:
    context = await memory_context(server, principal, body, Level.WRITE,
                                   erases=body.max_messages is not None)
    messages = incoming(body.messages, body.format)
    if body.scope in SHARED_SCOPES:
        messages = stamp(messages, principal)
    minimal = wants_minimal(prefer)
    result, echo = await append_and_echo(server, body.scope, body.key, messages, context,
                                         body.max_messages, memory_key(principal, idempotency),
                                         echo=not minimal)
    return mark_minimal(mark_replayed(ok({**_where(result), **echo}), result.replayed),
                        minimal)


@router.post("/history", response_model=Page[HistoryOut],
             summary="A page of a conversation, newest last, or the newest whole turns within "
                     "max_tokens (refused scope: 200, empty)")
async def history(body: HistoryBody, principal: Caller,
            server: Server) -> AsciiJSONResponse:
    if body.limit is not None and body.last is not None:
        raise ApiError("invalid_field", "give `limit` or its older name `last`, not both",
                       details=[{"code": "conflicting_fields", "message": "limit and last",
                                 "locator": "body.last"}])
    check_budget_knobs(server, "body", body.max_tokens,
                       {"limit": body.limit, "last": body.last, "offset": body.offset,
                        "before": body.before},
                       {"counter": body.counter, "keep_system": body.keep_system})
    limit, offset = clamp_page(body.limit if body.last is None else body.last, body.offset,
                               server.settings.page_size)
    context = await memory_context(server, principal, body, Level.READ)
    if body.max_tokens is not None:
        result, data, total, kept = await budget_answer(
            server, body.scope, body.key, context, max_tokens=body.max_tokens,
            counter=body.counter, format=body.format, keep_system=body.keep_system,
            where="body")
        return paged({**_where(result), **data}, total, kept, 0)
    page, total = await history_page(server, body.scope, body.key, context, limit=limit,
                                     offset=offset, before=body.before)
    return paged({**_where(page), "messages": positioned(page), "before": page.before,
                  **rendered(page, body.format)}, total, limit, offset)
