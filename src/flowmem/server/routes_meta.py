"""Service endpoints: health and who am I."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from .deps import Caller
from .models import WhoAmI
from .responses import AsciiJSONResponse

__all__ = ["router"]

router = APIRouter(tags=["service"])


class Health(BaseModel):
    """The service is up."""

    status: str


@router.get("/healthz", response_model=Health, summary="Liveness (no authentication)")
def healthz() -> AsciiJSONResponse:
    return AsciiJSONResponse({"status": "ok"})


@router.get("/v1/whoami", response_model=WhoAmI, summary="The caller, as the token says")
def whoami(principal: Caller) -> AsciiJSONResponse:
    return AsciiJSONResponse({"user_id": principal.user_id, "admin": principal.admin,
                              "anonymous": not principal.identified})
