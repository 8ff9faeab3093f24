"""The background sweep of ``flowmem serve``: expired conversations and values deleted.

Every ``interval`` seconds the sweeper runs :meth:`flowmem.AsyncMemory.sweep`
one batch at a time (each batch one short transaction of the store; the
loop serves requests between batches, so appends never wait for a whole
sweep), then writes ONE line to the ``flowmem`` log: how many were deleted
by scope and how long it took — never a key or any message content. The
counts also go to ``/metrics`` (``flowmem_expired_total{backend, scope}``),
through the memory's :class:`~flowmem.metrics.Metrics`. With the service's
session registry it then deletes the records of sessions that expired with
their conversations (:meth:`~flowmem.service.SessionRegistry.sweep`), counted
as scope ``session_record``. A failed sweep is logged and tried again at the
next interval.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from ..async_memory import AsyncMemory
from ..errors import FlowmemError
from ..retention import Swept

if TYPE_CHECKING:
    from ._sessions import SessionRegistry

__all__ = ["DEFAULT_BATCH", "sweep_forever", "sweep_once"]

logger = logging.getLogger("flowmem")

DEFAULT_BATCH = 100


def _counts(swept: Swept) -> str:
    return ", ".join(f"{scope}={count}" for scope, count in sorted(swept.by_scope.items()))


async def sweep_once(memory: AsyncMemory, batch: int = DEFAULT_BATCH,
                     sessions: SessionRegistry | None = None) -> Swept:
    """Sweep until nothing expired is left, one batch per turn of the loop, then the
    expired ``sessions`` records; logs one line."""
    start = time.perf_counter()
    swept = Swept()
    while True:
        step = await memory.sweep(batch=batch, max_batches=1)
        swept = swept.plus(step)
        if step.done:
            break
        await asyncio.sleep(0)  # requests waiting on the loop go first
    if sessions is not None and (records := await sessions.sweep(batch)):
        swept = swept.plus(Swept({"session_record": records}))
        if memory.metrics is not None:
            memory.metrics.swept(memory.backend, {"session_record": records})
    logger.info("flowmem: sweep deleted %d expired (%s) in %.3fs", swept.total,
                _counts(swept) or "none", time.perf_counter() - start)
    return swept


async def sweep_forever(memory: AsyncMemory, interval: float, batch: int = DEFAULT_BATCH,
                        sessions: SessionRegistry | None = None) -> None:
    """:func:`sweep_once` every ``interval`` seconds until cancelled."""
    while True:
        await asyncio.sleep(interval)
        try:
            await sweep_once(memory, batch, sessions)
        except FlowmemError as exc:  # the store failed: try again at the next interval
            logger.warning("flowmem: sweep failed (%s: %s); trying again in %gs",
                           type(exc).__name__, exc, interval)
