"""Who may reach which memory through ``/v1/memory/*``, and who wrote it.

:func:`memory_context` asks the access rules (:mod:`flowmem.access`) and
answers with the execution context of the operation or an :class:`ApiError`:

- **under a session** (``session_id``): the caller must DRIVE it (owner or
  admin), for reads too — a viewer gets 403 and nothing else (MEM-9); a
  stopped session refuses every write (409 ``session_stopped``); evicting
  (``max_messages``), overwriting or deleting its transcript is for admins
  only (403 ``messages_immutable``, MEM-15);
- **a shared scope** needs a grant of the right level (or admin, or the
  service's anonymous opt-in): :func:`flowmem.access.decide_scope`.

The writing principal of a shared-scope value is kept in a side record of
the reserved scope (``writer/<scope>/<scope id>``, key: the memory key), so
the value itself is exactly what the runtime wrote; a message appended to a
shared-scope conversation carries it as ``metadata.written_by`` (set by the
service, never taken from the request).
"""

from __future__ import annotations

from typing import Any, Final

from ..access import SHARED_SCOPES, Action, Level, Principal, decide_scope
from ..scopes import ExecutionContext, resolve_scope
from ..service._sessions import TRANSCRIPT_KEY, session_context
from ._deps import ServerState, session_for
from ._models import ScopedBody
from ._responses import ApiError

__all__ = ["WRITER_FIELD", "memory_context", "stamp"]

WRITER_FIELD: Final = "written_by"


async def memory_context(server: ServerState, principal: Principal, body: ScopedBody, level: Level,
                   *, erases: bool = False) -> ExecutionContext:
    """The context of one memory operation, once the access rules allow it.

    ``erases``: the operation may remove stored messages (a write or delete
    replaces the key; an append with ``max_messages`` evicts).
    """
    ids = body.context.model_dump()
    if body.session_id is None:
        context = ExecutionContext(user_id=principal.user_id, **ids)
    else:
        if not principal.identified:
            raise ApiError("unauthenticated", "a session needs a bearer token",
                           headers={"WWW-Authenticate": "Bearer"})
        record = await session_for(server, principal, body.session_id, Action.DRIVE)
        if erases and body.scope == "session" and body.key == TRANSCRIPT_KEY:
            await session_for(server, principal, body.session_id, Action.EDIT_MESSAGE)
        if level is Level.WRITE and record.status == "stopped":
            raise ApiError("session_stopped", "the session is stopped; reset it to write again")
        context = session_context(record, **ids)
    if body.scope in SHARED_SCOPES:
        scope_id = resolve_scope(body.scope, context)
        decision = decide_scope(principal, body.scope, scope_id, level,
                                anonymous=server.settings.anonymous)
        if not decision.allowed:
            if not principal.identified:
                raise ApiError("unauthenticated", decision.reason,
                               headers={"WWW-Authenticate": "Bearer"})
            raise ApiError("scope_forbidden", decision.reason)
    return context


def _who(principal: Principal) -> str:
    return principal.user_id if principal.user_id is not None else "anonymous"


def stamp(messages: list[dict[str, Any]], principal: Principal) -> list[dict[str, Any]]:
    """Messages for a shared-scope conversation, each naming who wrote it (the
    request's own ``written_by``, flat or in ``metadata``, is replaced)."""
    stamped = []
    for message in messages:
        copy = {k: v for k, v in message.items() if k != WRITER_FIELD}
        copy["metadata"] = {**(copy.get("metadata") or {}), WRITER_FIELD: _who(principal)}
        stamped.append(copy)
    return stamped
