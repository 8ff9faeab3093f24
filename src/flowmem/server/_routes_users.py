"""``DELETE /v1/users/{user_id}``: a user erased from the service (admin only).

What goes — her user scope, the sessions she owns (transcript, session
memory, viewer links), her viewer links to others' sessions, her tokens, the
writer records naming her, the idempotency records of everything deleted —
is :func:`flowmem.service._erasure.erase_user`'s. The answer is the receipt
(counts, never content); ``?dry_run=true`` counts and deletes nothing. Each
erasure writes one audit line to the ``flowmem`` log (who asked, whom, the
counts) and adds its counts to ``flowmem_erased_items_total{kind}`` in
``/metrics``. Erasing again answers zero counts.
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request

from ..service._erasure import erase_user
from ._deps import Identified, Server
from ._response_models import ErasureOut, Ok
from ._responses import ApiError, AsciiJSONResponse, ok
from ._route import GatedRoute

__all__ = ["router"]

logger = logging.getLogger("flowmem")

router = APIRouter(prefix="/v1/users", tags=["users"], route_class=GatedRoute)
UserId = Annotated[str, Path(min_length=1, max_length=256, description="The user to erase.")]
DryRun = Annotated[bool, Query(description="Count what would go; delete nothing.")]


@router.delete("/{user_id}", response_model=Ok[ErasureOut],
               summary="Erase a user: her memory, sessions, viewer links, tokens (admin only)")
async def erase(user_id: UserId, principal: Identified, server: Server, request: Request,
                dry_run: DryRun = False) -> AsciiJSONResponse:
    if not principal.admin:
        raise ApiError("forbidden", "erasing a user is for the administrative tier")
    receipt = await erase_user(server.memory, user_id, dry_run=dry_run,
                               registry=server.sessions, writers=server.writers)
    server.changes.tokens.clear()  # this process keeps nothing of hers (others: announced)
    server.changes.sessions.clear()
    counts = receipt.counts
    if not dry_run:
        erased = request.app.state.flowmem_metrics.erased
        for kind, count in counts.items():
            if count:
                erased.labels(kind).inc(count)
    logger.info("flowmem: audit: %s user %r by admin %r: %s",
                "dry run of erasing" if dry_run else "erased", receipt.user_id,
                principal.user_id,
                " ".join(f"{kind}={count}" for kind, count in counts.items()))
    return ok(receipt.to_json())
