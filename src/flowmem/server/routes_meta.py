"""Service endpoints: health and who am I."""

from __future__ import annotations

from fastapi import APIRouter

from .deps import Caller
from .models import Health, Ok, WhoAmI
from .responses import AsciiJSONResponse, ok

__all__ = ["router"]

router = APIRouter(tags=["service"])


@router.get("/healthz", response_model=Ok[Health], summary="Liveness (no authentication)")
async def healthz() -> AsciiJSONResponse:
    return ok({"status": "ok"})


@router.get("/v1/whoami", response_model=Ok[WhoAmI], summary="The caller, as the token says")
async def whoami(principal: Caller) -> AsciiJSONResponse:
    return ok({"user_id": principal.user_id, "admin": principal.admin,
               "anonymous": not principal.identified})
