"""``GET /v1/sessions/{id}/events``: a session's changes as server-sent events.

Who may listen is who may read the session (``Action.VIEW``: the owner, a
viewer, an admin): absence before denial, so a stranger gets the same 404
as for a session that does not exist. The caller is re-checked on every
poll, token first: a revoked or expired token ends the stream at once
(``end`` with reason ``unauthenticated``), a revoked viewer's too (``gone``).

The stream polls the session record and the newest :data:`~.events.TAIL`
entries of its transcript every :data:`POLL` seconds (so appends by any
process reach it, not only this one's) and sends:

- ``snapshot`` ``{count, newest, status}`` once, when it opens;
- ``change`` (:meth:`.events.Change.to_json`): entries added, placeholders
  inserted (MEM-3), placeholders replaced by a late result (MEM-10), other
  edits, entries removed, and the delta since the previous event (MEM-14);
- ``status`` ``{status}`` when the session's status changes;
- ``end`` ``{reason}`` before it closes: ``timeout`` (the stream lives at most
  ``timeout`` seconds, 0..3600, default 300 — a client reconnects),
  ``gone`` (the session vanished or the caller lost access),
  ``unauthenticated`` (the caller's token was revoked or expired),
  ``shutdown`` (the service is stopping), ``store`` (a store failure, logged).

A comment line keeps an idle stream alive every :data:`KEEPALIVE` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any, Final

from fastapi import APIRouter, Query, Request
from starlette.responses import StreamingResponse

from ..access import Action, Principal
from ..errors import FlowmemError
from ..service._changes import ARRIVED
from ..service._events import TAIL, Change, Tail, sse
from ..service._sessions import TRANSCRIPT_KEY, session_context
from ..service._tokens import InvalidCredentials
from ._deps import Identified, Server, ServerState, history_page, session_for
from ._responses import ApiError

__all__ = ["KEEPALIVE", "POLL", "STOP_STREAM", "router"]

logger = logging.getLogger("flowmem")

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])

POLL: Final = 0.5
"""Seconds between two looks at the session."""
KEEPALIVE: Final = 15.0
"""Seconds of silence after which a comment line is sent."""
STOP_STREAM: Final = "flowmem_stop_stream"
"""The request-state entry ``flowmem serve`` calls to end a stream at shutdown."""
MAX_LIFETIME: Final = 3600
Lifetime = Annotated[int | None, Query(description="Seconds the stream stays open, "
                                                     "clamped to 0..3600 (default 300).")]


async def _look(server: ServerState, principal: Principal, session_id: str,
                since: float | None = None) -> tuple[str, list[int], list[dict[str, Any]], int]:
    """The session's status and the newest entries of its transcript (raises ApiError);
    ``since``: as :func:`~.deps.session_for` (a later look sees every change made before it)."""
    record = await session_for(server, principal, session_id, Action.VIEW, since=since)
    page, total = await history_page(server, "session", TRANSCRIPT_KEY, session_context(record),
                                     limit=TAIL, offset=0, before=None)
    return record.status, list(page.positions), list(page.messages), total


async def _events(server: ServerState, header: str | None, session_id: str,
                  first: tuple[str, list[int], list[dict[str, Any]], int], lifetime: float,
                  stop: asyncio.Event) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    status, positions, messages, count = first
    tail = Tail()
    tail.change(positions, messages, count)
    yield b"retry: 2000\n\n"
    yield sse("snapshot", {"count": count, "newest": positions[-1] if positions else None,
                           "status": status})
    deadline = loop.time() + lifetime
    spoke = loop.time()
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            yield sse("end", {"reason": "timeout"})
            return
        try:
            await asyncio.wait_for(stop.wait(), min(POLL, remaining))
            yield sse("end", {"reason": "shutdown"})
            return
        except TimeoutError:
            pass
        since = time.monotonic()
        ARRIVED.set(since)  # this poll sees every revocation announced before it
        try:  # the token first, on every poll: revoked or expired ends the stream at once
            principal = await server.tokens.authenticate(header)
        except InvalidCredentials:
            yield sse("end", {"reason": "unauthenticated"})
            return
        try:
            now_status, positions, messages, count = await _look(server, principal, session_id,
                                                                 since=since)
        except ApiError:
            yield sse("end", {"reason": "gone"})
            return
        except FlowmemError as exc:
            logger.error("flowmem: event stream of session %s: store error: %s", session_id, exc)
            yield sse("end", {"reason": "store"})
            return
        change: Change = tail.change(positions, messages, count)
        if now_status != status:
            status = now_status
            spoke = loop.time()
            yield sse("status", {"status": status})
        if not change.empty:
            spoke = loop.time()
            yield sse("change", change.to_json())
        elif loop.time() - spoke >= KEEPALIVE:
            spoke = loop.time()
            yield b": keepalive\n\n"


@router.get("/{session_id}/events", include_in_schema=False,
            summary="Server-sent events of the session's changes (viewers too)")
async def session_events(session_id: str, request: Request, principal: Identified,
                         server: Server, timeout: Lifetime = None) -> StreamingResponse:
    first = await _look(server, principal, session_id)  # 404 before 403 before any byte
    lifetime = float(max(0, min(MAX_LIFETIME, 300 if timeout is None else timeout)))
    stop = asyncio.Event()
    setattr(request.state, STOP_STREAM, stop.set)
    return StreamingResponse(
        _events(server, request.headers.get("authorization"), session_id, first, lifetime,
                stop),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
