"""Session endpoints: create, get, list mine, grant/revoke view, and driving.

Every route needs a token. Driving (append a turn, stop, reset) is for the
owner or an admin only; viewers read, never drive (MEM-9). Editing,
deleting or evicting (``max_messages``) stored messages is admin-only
(MEM-15); a stopped session takes no turn. Every access question goes to
:func:`flowmem.access.authorize`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Path, Query

from ..access import Action, Principal, SessionRecord, authorize
from ..ids import usable_id
from ..messages import canonical_message
from ..service._sessions import TRANSCRIPT_KEY, clear_memory, session_context
from ._budget_fields import CounterQuery, KeepSystemQuery, MaxTokensQuery
from ._budgets import budget_answer, check_budget_knobs
from ._deps import (
    Identified,
    Server,
    ServerState,
    append_and_echo,
    history_page,
    incoming,
    positioned,
    rendered,
    session_for,
)
from ._idempotency import IdempotencyHeader, mark_replayed, memory_key
from ._limits import check_messages
from ._models import EditBody, EmptyBody, GrantBody, SessionCreate, TurnBody
from ._prefer import PreferHeader, mark_minimal, wants_minimal
from ._response_models import MessagePage, Ok, Page, PositionedMessage, SessionOut, TurnOut
from ._responses import ApiError, AsciiJSONResponse, clamp_page, ok, paged
from ._route import GatedRoute

__all__ = ["router"]

router = APIRouter(prefix="/v1/sessions", tags=["sessions"], route_class=GatedRoute)
MAX_POSITION = 2**62
Cursor = Annotated[int | None, Query(ge=0, le=MAX_POSITION,
                                     description="Position cursor: messages older than this.")]
Position = Annotated[int, Path(ge=0, le=MAX_POSITION, description="A message's stable position.")]
Limit = Annotated[int | None, Query(description="Page size, clamped to 1..100 (API-6).")]
Offset = Annotated[int | None, Query(description="Rows to skip, floored at 0 (API-6).")]
Role = Annotated[Literal["owner", "viewer"], Query(description="Sessions I own or may view.")]
Dialect = Annotated[Literal["canonical", "openai", "responses", "anthropic"], Query(
    description="Also render the page as this provider takes it (`rendered`; docs/formats.md).")]
Optional = Annotated[EmptyBody | None, Body(description="Optional; absent reads as `{}`.")]


def _out(server: ServerState, principal: Principal, record: SessionRecord) -> dict[str, Any]:
    data = record.to_json()
    if not authorize(principal, Action.MANAGE, record, server.settings.hooks).allowed:
        data["viewers"] = []
    return data


@router.post("", status_code=201, response_model=Ok[SessionOut],
             summary="Create a session owned by the caller (owner_less: admin only)")
async def create_session(body: SessionCreate, principal: Identified,
                   server: Server) -> AsciiJSONResponse:
    owner = None if body.owner_less else principal.user_id
    proposed = SessionRecord(id="", owner=owner, title=body.title)
    decision = authorize(principal, Action.CREATE, proposed, server.settings.hooks)
    if not decision.allowed:
        raise ApiError("forbidden", decision.reason)
    record = await server.sessions.create(owner, body.title)
    return ok(_out(server, principal, record), 201)


@router.get("", response_model=Page[list[SessionOut]],
            summary="List the sessions I own (or may view), API-6 paging")
async def list_sessions(principal: Identified, server: Server, role: Role = "owner",
                  limit: Limit = None, offset: Offset = None) -> AsciiJSONResponse:
    assert principal.user_id is not None
    size, skip = clamp_page(limit, offset, server.settings.page_size)
    records, total = await server.sessions.listing(principal.user_id, role, offset=skip,
                                                   limit=size)
    return paged([_out(server, principal, r) for r in records], total, size, skip)


@router.get("/{session_id}", response_model=Ok[SessionOut], summary="Get a session (viewers too)")
async def get_session(session_id: str, principal: Identified,
                server: Server) -> AsciiJSONResponse:
    record = await session_for(server, principal, session_id, Action.VIEW)
    return ok(_out(server, principal, record))


@router.post("/{session_id}/viewers", response_model=Ok[SessionOut],
             summary="Grant view to a user (owner or admin)")
async def grant_view(session_id: str, body: GrantBody, principal: Identified,
               server: Server) -> AsciiJSONResponse:
    record = await session_for(server, principal, session_id, Action.MANAGE)
    grantee = usable_id(body.user_id)
    if grantee is None:
        raise ApiError("invalid_field", "user_id must be a usable id (not blank, not 0)",
                       details=[{"code": "unusable_id", "message": "not a usable id",
                                 "locator": "body.user_id"}])
    if grantee not in record.viewers and len(record.viewers) >= server.settings.max_viewers:
        raise ApiError("invalid_field",
                       f"a session has at most {server.settings.max_viewers} viewers",
                       details=[{"code": "too_many_viewers", "message": "viewer limit reached",
                                 "locator": "body.user_id"}])
    return _updated(server, principal, await server.sessions.grant(session_id, grantee))


@router.delete("/{session_id}/viewers/{user_id}", response_model=Ok[SessionOut],
               summary="Revoke a user's view (owner or admin)")
async def revoke_view(session_id: str, user_id: str, principal: Identified,
                server: Server) -> AsciiJSONResponse:
    await session_for(server, principal, session_id, Action.MANAGE)
    return _updated(server, principal,
                    await server.sessions.revoke(session_id, user_id.strip()))


def _writable(record: SessionRecord) -> None:
    if record.status == "stopped":
        raise ApiError("session_stopped", "the session is stopped; reset it to write again")


@router.post("/{session_id}/turns", response_model=Ok[TurnOut],
             summary="Drive: append a turn (owner or admin, MEM-9; MEM-1..14 semantics)")
async def append_turn(session_id: str, body: TurnBody, principal: Identified, server: Server,
                      idempotency: IdempotencyHeader = None,
                      prefer: PreferHeader = None) -> AsciiJSONResponse:
    record = await session_for(server, principal, session_id, Action.DRIVE)
    if body.max_messages is not None:  # evicting session messages: admin only (MEM-15)
        await session_for(server, principal, session_id, Action.EDIT_MESSAGE)
    _writable(record)
    messages = incoming(body.messages, body.format)
    minimal = wants_minimal(prefer)
    result, echo = await append_and_echo(server, "session", TRANSCRIPT_KEY, messages,
                                         session_context(record),
                                         body.max_messages or server.settings.session_window,
                                         memory_key(principal, idempotency), echo=not minimal)
    await server.sessions.turn_finished(record)
    return mark_minimal(mark_replayed(ok(echo), result.replayed), minimal)


@router.post("/{session_id}/stop", response_model=Ok[SessionOut],
             summary="Drive: stop the session (owner or admin, MEM-9)")
async def stop_session(session_id: str, principal: Identified, server: Server,
                 body: Optional = None) -> AsciiJSONResponse:
    await session_for(server, principal, session_id, Action.DRIVE)
    return _updated(server, principal, await server.sessions.set_status(session_id, "stopped"))


@router.post("/{session_id}/reset", response_model=Ok[SessionOut],
             summary="Drive: clear the session's memory; status idle (owner or admin)")
async def reset_session(session_id: str, principal: Identified, server: Server,
                  body: Optional = None) -> AsciiJSONResponse:
    record = await session_for(server, principal, session_id, Action.DRIVE)
    await clear_memory(server.memory, record)
    return _updated(server, principal, await server.sessions.set_status(session_id, "idle"))


@router.get("/{session_id}/messages", response_model=Page[MessagePage],
            summary="A page of the session's messages, oldest first, or the newest whole "
                    "turns within max_tokens (viewers too)")
async def list_messages(session_id: str, principal: Identified, server: Server,
                        limit: Limit = None, offset: Offset = None, before: Cursor = None,
                        format: Dialect = "canonical", max_tokens: MaxTokensQuery = None,
                        counter: CounterQuery = None,
                        keep_system: KeepSystemQuery = None) -> AsciiJSONResponse:
    check_budget_knobs(server, "query", max_tokens,
                       {"limit": limit, "offset": offset, "before": before},
                       {"counter": counter, "keep_system": keep_system})
    record = await session_for(server, principal, session_id, Action.VIEW)
    if max_tokens is not None:
        _, data, total, kept = await budget_answer(
            server, "session", TRANSCRIPT_KEY, session_context(record), max_tokens=max_tokens,
            counter=counter, format=format, keep_system=keep_system, where="query")
        return paged(data, total, kept, 0)
    size, skip = clamp_page(limit, offset, server.settings.page_size)
    page, total = await history_page(server, "session", TRANSCRIPT_KEY, session_context(record),
                                     limit=size, offset=skip, before=before)
    return paged({"messages": positioned(page), "before": page.before,
                  **rendered(page, format)}, total, size, skip)


def _updated(server: ServerState, principal: Principal,
             record: SessionRecord | None) -> AsciiJSONResponse:
    """The session after a change, or 404 when it vanished meanwhile."""
    if record is None:
        raise ApiError("session_not_found", "no such session")
    return ok(_out(server, principal, record))


@router.put("/{session_id}/messages/{position}", response_model=Ok[PositionedMessage],
            summary="Replace one message (admin only, MEM-15)")
async def update_message(session_id: str, position: Position, body: EditBody,
                         principal: Identified, server: Server) -> AsciiJSONResponse:
    record = await session_for(server, principal, session_id, Action.EDIT_MESSAGE)
    _writable(record)  # a stopped session refuses every write, an admin's too
    raw = body.message.model_dump(exclude_unset=True)
    check_messages([raw], server.settings.limits)
    message = canonical_message(raw, where="message")
    if not await server.memory.edit("session", TRANSCRIPT_KEY, position, message,
                                    context=session_context(record)):
        raise ApiError("message_not_found", f"no message at position {position}")
    return ok({"position": position, "message": message})


@router.delete("/{session_id}/messages/{position}", response_model=Ok[PositionedMessage],
               summary="Delete one message (admin only, MEM-15)")
async def delete_message(session_id: str, position: Position, principal: Identified,
                   server: Server) -> AsciiJSONResponse:
    record = await session_for(server, principal, session_id, Action.EDIT_MESSAGE)
    _writable(record)  # a stopped session refuses every write, an admin's too
    context = session_context(record)
    page = await server.memory.history("session", TRANSCRIPT_KEY, context=context, last=1,
                                       before=position + 1)
    if page.positions != [position] or not await server.memory.edit(
            "session", TRANSCRIPT_KEY, position, None, context=context):
        raise ApiError("message_not_found", f"no message at position {position}")
    return ok({"position": position, "message": page.messages[0]})
