"""What every route needs: the service state, the caller, the session it names.

Every dependency and helper that may touch the store is a coroutine over the
app's :class:`~flowmem.AsyncMemory` and its :class:`~flowmem.store.AsyncStore`:
no store call runs on the event loop's thread blocking, and no endpoint or
dependency is handed to a thread pool.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Annotated, Any, Final

from fastapi import Depends, Request
from fastapi.security import HTTPBearer
from pydantic import BaseModel
from starlette.datastructures import Headers
from starlette.types import Scope

from ..access import Action, Principal, SessionRecord, authorize
from ..async_memory import AsyncMemory
from ..formats import render, to_canonical
from ..results import HistoryResult, ScopedAppendResult
from ..scopes import ExecutionContext
from ..service._changes import ARRIVED, Changes
from ..service._sessions import SessionRegistry
from ..service._tokens import InvalidCredentials, TokenBackend, bearer_token
from ..service._writers import WriterRecords
from ._limits import check_messages
from ._ratelimit import RateLimiter
from ._responses import ApiError, Encoded, ascii_json
from ._settings import Settings

__all__ = [
    "Caller",
    "Identified",
    "Server",
    "ServerState",
    "admit",
    "append_and_echo",
    "caller",
    "history_page",
    "identified",
    "incoming",
    "positioned",
    "rendered",
    "session_for",
    "state",
    "strict_query",
]

logger = logging.getLogger("flowmem")

_bearer = HTTPBearer(auto_error=False, scheme_name="bearer",
                     description="`Authorization: Bearer <token>` from `flowmem token create`. "
                                 "Without it the caller is anonymous.")


@dataclass(frozen=True, slots=True)
class ServerState:
    """The objects one app serves from."""

    memory: AsyncMemory
    tokens: TokenBackend
    sessions: SessionRegistry
    settings: Settings
    limiter: RateLimiter
    changes: Changes
    writers: WriterRecords


def _state(request: Request) -> ServerState:
    found: ServerState = request.app.state.flowmem
    return found


async def state(request: Request) -> ServerState:
    """The app's :class:`ServerState` (a coroutine: FastAPI runs it on the loop, no thread)."""
    return _state(request)


async def caller(request: Request, _: Annotated[object, Depends(_bearer)]) -> Principal:
    """The caller, from the bearer token only; then the caller's rate limit.

    Without a token: 401, unless the service opted in to anonymous use of
    the shared scopes (``Settings.anonymous``), when the caller is anonymous.
    """
    admitted = request.scope.get(_ADMITTED)  # the body gate's check of this request
    if admitted is None:
        ARRIVED.set(time.monotonic())  # what this request may use of the caches (.changes)
    server = _state(request)
    header = request.headers.get("authorization")
    if header is None and server.settings.anonymous is None:
        raise ApiError("unauthenticated", "this service needs a bearer token",
                       headers={"WWW-Authenticate": "Bearer"})
    try:
        principal = admitted if isinstance(admitted, Principal) else \
            await server.tokens.authenticate(header)
    except InvalidCredentials as exc:
        _limit(server, _client_key(request.scope))  # guessing tokens: per client address
        raise ApiError("invalid_token", str(exc),
                       headers={"WWW-Authenticate": 'Bearer error="invalid_token"'}) from None
    token = bearer_token(header) if header is not None else None
    # the token's bucket, keyed on its id: however the header spells the scheme
    _limit(server, _client_key(request.scope) if token is None
           else f"token:{TokenBackend.token_id(token)}")
    return principal


async def admit(server: ServerState, scope: Scope) -> None:
    """The body gate's first question (raises :class:`ApiError` 401): may this request's
    body be read at all? Only with a valid token — or none, where the service opted in
    to anonymous callers. Nothing is spent of the token's rate limit here (the route's
    :func:`caller` does); a wrong token spends its client address's."""
    ARRIVED.set(time.monotonic())
    header = Headers(scope=scope).get("authorization")
    if header is None:
        if server.settings.anonymous is None:
            raise ApiError("unauthenticated", "this service needs a bearer token",
                           headers={"WWW-Authenticate": "Bearer"})
        return
    try:
        scope[_ADMITTED] = await server.tokens.authenticate(header)
    except InvalidCredentials as exc:
        _limit(server, _client_key(scope))
        raise ApiError("invalid_token", str(exc),
                       headers={"WWW-Authenticate": 'Bearer error="invalid_token"'}) from None


_ADMITTED: Final = "flowmem.principal"
"""The scope entry holding the principal :func:`admit` found (the route does not look again)."""


def _client_key(scope: Scope) -> str:
    client = scope.get("client")
    return f"client:{client[0] if client else '?'}"


def _limit(server: ServerState, key: str) -> None:
    """Spend one request of ``key``'s bucket (a token's id, or a client address)."""
    if server.limiter.rate <= 0:
        return
    wait = server.limiter.take(key)
    if wait:
        raise ApiError("rate_limited", f"too many requests; retry after {wait} s",
                       headers={"Retry-After": str(wait)})


async def identified(principal: Annotated[Principal, Depends(caller)]) -> Principal:
    """The caller, who must have an identity (401 for anonymous)."""
    if not principal.identified:
        raise ApiError("unauthenticated", "this operation needs a bearer token",
                       headers={"WWW-Authenticate": "Bearer"})
    return principal


Caller = Annotated[Principal, Depends(caller)]
"""The caller (anonymous without a token)."""
Identified = Annotated[Principal, Depends(identified)]
"""The caller, who must have an identity."""
Server = Annotated[ServerState, Depends(state)]
"""The app's state."""


def _query_names(dependant: Any) -> set[str]:
    names = {param.alias for param in dependant.query_params}
    for child in dependant.dependencies:
        names |= _query_names(child)
    return names


async def strict_query(request: Request) -> None:
    """Unknown query parameters are refused (400), like unknown body fields."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None or not request.query_params:
        return
    unknown = sorted(set(request.query_params) - _query_names(dependant))
    if unknown:
        raise ApiError("invalid_field",
                       f"unknown query parameter(s): {', '.join(map(repr, unknown))}",
                       details=[{"code": "extra_forbidden", "message": "unknown query parameter",
                                 "locator": f"query.{name}"} for name in unknown])


async def session_for(server: ServerState, principal: Principal, session_id: str,
                      action: Action, *, since: float | None = None) -> SessionRecord:
    """The session, if the access rules and hooks allow ``action`` on it.

    Not allowed and not visible (unknown, unloadable, or foreign): 404, so a
    refusal never reveals a foreign session. Visible but not allowed: 403.
    The record reflects every change announced before the request arrived, or
    before ``since`` (``time.monotonic()``, for a stream's later looks).
    """
    if since is not None:
        await server.changes.settle(since)
    record = await server.sessions.cached(session_id)
    decision = authorize(principal, action, record, server.settings.hooks)
    if decision.error is not None:
        logger.warning("flowmem: %s; denying %s", decision.error, action.value)
    if decision.allowed and record is not None:
        return record
    if not decision.visible:  # absence before denial: never reveal a foreign session
        raise ApiError("session_not_found", "no such session")
    if action is Action.EDIT_MESSAGE and not principal.admin:
        raise ApiError("messages_immutable", decision.reason)
    raise ApiError("forbidden", decision.reason)


def incoming(messages: list[Any], format: str) -> list[dict[str, Any]]:
    """A body's messages as canonical entries: provider dialects converted at the door
    (:mod:`flowmem.formats`), so limits, stamps and rules see one shape."""
    dumped = [m.model_dump(exclude_unset=True) if isinstance(m, BaseModel) else m
              for m in messages]
    return dumped if format == "canonical" else to_canonical(dumped, format)


def rendered(page: HistoryResult, format: str) -> dict[str, Any]:
    """``{"rendered": ...}`` for a history answer in a provider's shape (none for canonical)."""
    if format == "canonical":
        return {}
    result = render(page.messages, format)
    return {"rendered": {"format": format, "dropped": result.dropped, "output": result.output}}


def positioned(page: HistoryResult) -> Encoded:
    """A history page as ``{"position", "message"}`` pairs, oldest first: the JSON text
    made of the store's own text of each message when it gave it (no encoding again)."""
    def plain() -> list[dict[str, Any]]:
        return [{"position": p, "message": m}
                for p, m in zip(page.positions, page.messages, strict=True)]

    texts = page.encoded
    if texts is None or len(texts) != len(page.positions):
        return Encoded(ascii_json(plain()), plain)
    known = _PAIRS
    if len(known) > _PAIRS_KEPT:
        known.clear()
    pairs = []
    for pair in zip(page.positions, texts, strict=True):
        text = known.get(pair)
        if text is None:  # echoes overlap: a turn's echo is mostly the last one's
            text = f'{{"position":{pair[0]},"message":{pair[1]}}}'
            if len(pair[1]) <= _PAIR_TEXT_KEPT:
                known[pair] = text
        pairs.append(text)
    return Encoded(f"[{','.join(pairs)}]", plain)


_PAIRS: Final[dict[tuple[int, str], str]] = {}
_PAIRS_KEPT: Final = 4096  # entries remembered (emptied when full) ...
_PAIR_TEXT_KEPT: Final = 1024  # ... each of at most this many characters: ~8 MB at most


async def history_page(server: ServerState, scope: str, key: str, context: ExecutionContext, *,
                 limit: int, offset: int, before: int | None) -> tuple[HistoryResult, int]:
    """A page of a conversation and its total (API-6), at a cost bounded by the page.

    The page is the ``limit`` messages older than the newest ``offset``
    messages older than ``before``; the total is the conversation's, counted
    before paging (API-6: ``before`` is a cursor, not a filter), as the store
    counts it: the buffer's own count.
    """
    fetched = await server.memory.history(scope, key, context=context, last=offset + limit,
                                          before=before)
    page = fetched.kept(max(len(fetched.positions) - offset, 0))
    total = fetched.total
    if before is not None:  # the cursor pages; the total is the whole conversation's (API-6)
        total = (await server.memory.history(scope, key, context=context, last=1)).total
    if total is None:  # a store that does not count: count the positions (linear)
        total = len((await server.memory.history(scope, key, context=context)).positions)
    return page, total


async def append_and_echo(server: ServerState, scope: str, key: str, messages: list[dict[str, Any]],
                          context: ExecutionContext, window: int | None,
                          idempotency_key: str | None = None, *, echo: bool = True,
                          ) -> tuple[ScopedAppendResult, dict[str, Any]]:
    """Check the limits, append through ``AsyncMemory`` (MEM-1..14), and echo the newest
    messages — none under a refusal, which has already logged its one warning (MEM-7),
    nor without ``echo`` (``Prefer: return=minimal``, :mod:`.prefer`). The echo is the
    append's own tail (``tail=``): read in its transaction, so it shows exactly what the
    append left, with no second read. ``idempotency_key`` makes a retry replay the first
    outcome (:mod:`.idempotency`)."""
    check_messages(messages, server.settings.limits)
    tail = server.settings.echo if echo and server.settings.echo > 0 else None
    result = await server.memory.append(scope, key, messages, context=context,
                                        max_messages=window, idempotency_key=idempotency_key,
                                        tail=tail)
    answer: dict[str, Any] = {**result.to_dict(), "messages": [], "before": None}
    page = result.tail
    if page is not None and not result.refused:
        answer.update(messages=positioned(page), before=page.before)
    return result, answer
