"""Memory endpoints for a runtime: read, write, delete, append under a scope.

The execution ids come from the request; the user id from the token only.
Under a session (``session_id``: view it to read, drive it to write) the
``user`` scope is the session OWNER, only when the owner is a real user —
never whoever drives (MEM-8) — and the ``session`` scope is that session.

A refused scope (MEM-6, MEM-13) answers the neutral MEM-7 result with
status 200 and ``refused: true``: a read ``found: false`` with the default,
a write or delete ``ok: false``, an append ``count: 0`` and no messages;
``resolved_scope_id`` is ``""``. Nothing reaches the store, and no fallback
bucket is ever used. The refusal itself is decided by
:meth:`flowmem.Memory._locate`, not here.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from ..access import Action, Principal
from ..memory import DeleteResult, HistoryResult, ReadResult, ScopedAppendResult, WriteResult
from ..scopes import ExecutionContext
from .deps import Caller, Server, ServerState, append_and_echo, positioned, session_for
from .models import (
    AppendBody,
    AppendOut,
    DeleteOut,
    HistoryBody,
    HistoryOut,
    ReadBody,
    ReadOut,
    ScopedBody,
    WriteBody,
    WriteOut,
)
from .responses import AsciiJSONResponse
from .sessions import session_context

__all__ = ["router"]

router = APIRouter(prefix="/v1/memory", tags=["memory"])


def _context(server: ServerState, principal: Principal, body: ScopedBody,
             action: Action) -> ExecutionContext:
    ids = body.context.model_dump()
    if body.session_id is None:
        return ExecutionContext(user_id=principal.user_id, **ids)
    record = session_for(server, principal, body.session_id, action)
    return session_context(record, **ids)


def _where(result: ReadResult | WriteResult | DeleteResult | ScopedAppendResult | HistoryResult,
           ) -> dict[str, Any]:
    return {"scope": result.scope, "resolved_scope_id": result.resolved_scope_id,
            "refused": result.refused}


@router.post("/read", response_model=ReadOut,
             summary="Read a key (refused scope: 200, found false, refused true)")
def read(body: ReadBody, principal: Caller,
         server: Server) -> AsciiJSONResponse:
    context = _context(server, principal, body, Action.VIEW)
    result = server.memory.read(body.scope, body.key, context=context, default=body.default)
    return AsciiJSONResponse({**_where(result),
                              "value": result.value, "found": result.found})


@router.post("/write", response_model=WriteOut,
             summary="Write a key (refused scope: 200, ok false, refused true)")
def write(body: WriteBody, principal: Caller,
          server: Server) -> AsciiJSONResponse:
    context = _context(server, principal, body, Action.DRIVE)
    result = server.memory.write(body.scope, body.key, body.value, context=context)
    return AsciiJSONResponse({**_where(result), "ok": result.ok})


@router.post("/delete", response_model=DeleteOut,
             summary="Delete a key (refused scope: 200, ok false, refused true)")
def delete(body: ScopedBody, principal: Caller,
           server: Server) -> AsciiJSONResponse:
    context = _context(server, principal, body, Action.DRIVE)
    result = server.memory.delete(body.scope, body.key, context=context)
    return AsciiJSONResponse({**_where(result),
                              "ok": result.ok, "found": result.found})


@router.post("/append", response_model=AppendOut,
             summary="Append to a conversation, MEM-1..14 (refused scope: 200, count 0)")
def append(body: AppendBody, principal: Caller,
           server: Server) -> AsciiJSONResponse:
    context = _context(server, principal, body, Action.DRIVE)
    messages = [m.model_dump(exclude_unset=True) for m in body.messages]
    result, echo = append_and_echo(server, body.scope, body.key, messages, context,
                                   body.max_messages)
    return AsciiJSONResponse({**_where(result), **echo})


@router.post("/history", response_model=HistoryOut,
             summary="A page of a conversation, newest last (refused scope: 200, empty)")
def history(body: HistoryBody, principal: Caller,
            server: Server) -> AsciiJSONResponse:
    context = _context(server, principal, body, Action.VIEW)
    page = server.memory.history(body.scope, body.key, context=context, last=body.last,
                                 before=body.before)
    return AsciiJSONResponse({**_where(page), "messages": positioned(page),
                              "before": page.before})
