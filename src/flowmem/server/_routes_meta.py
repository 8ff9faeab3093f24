"""Service endpoints: health and who am I."""

from __future__ import annotations

from typing import Final

from fastapi import APIRouter

from ..service._registry import reserved
from ._deps import Caller, Server
from ._response_models import Health, Ok, WhoAmI
from ._responses import AsciiJSONResponse, ok

__all__ = ["router"]

router = APIRouter(tags=["service"])


_PROBE: Final = reserved("health", "probe")


@router.get("/healthz", response_model=Ok[Health],
            summary="Liveness and the store's (no authentication)")
async def healthz(server: Server) -> AsciiJSONResponse:
    """``ok`` once the store answers a read (nothing is written); a store that cannot
    answers its error (503 ``store_unavailable``, ``store_failed``, ...)."""
    await server.memory.store.read(_PROBE)
    return ok({"status": "ok"})


@router.get("/v1/whoami", response_model=Ok[WhoAmI], summary="The caller, as the token says")
async def whoami(principal: Caller) -> AsciiJSONResponse:
    return ok({"user_id": principal.user_id, "admin": principal.admin,
               "anonymous": not principal.identified})
