"""A user erased from the service: what the service keeps about her, on top of her memory.

:func:`erase_user` (the CLI's ``flowmem erase`` and the admin-only
``DELETE /v1/users/{id}``) deletes, in this order:

1. her **tokens** (announced at once, so no process lets her start a request);
2. every **session she owns**: its viewers' links, its ``session`` scope (the
   transcript and the session memory: :meth:`~flowmem.store.Store.erase`,
   fenced like her own scope, so a turn racing it is erased or refused), its
   record and her owner link;
3. her **viewer links** to other people's sessions, and her name in those
   sessions' viewer lists;
4. the **writer records** naming her as the last writer of a shared value
   (the value stays: ``global``, ``workflow``, ``pipeline`` and ``execution``
   memories are not hers alone; ``written_by`` then reads ``null``);
5. her **user scope**: :meth:`flowmem.AsyncMemory.erase_user`.

The idempotency records of everything deleted go with it (the store finds
them by the key they guard); the HTTP service's retry keys name their caller
only by a digest. A dry run counts and deletes nothing. The answer is an
:class:`~flowmem.erasure.ErasureReceipt` (counts, never content); one log line
says what went.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from ..async_memory import AsyncMemory
from ..erasure import ErasureReceipt, erased_user_id, log
from ._changes import announce
from ._registry import RESERVED_SCOPE, as_mapping, reserved
from ._sessions import SessionRegistry
from ._writers import WriterRecords

__all__ = ["erase_user"]


async def erase_user(memory: AsyncMemory, user_id: Any, *, dry_run: bool = False,
                     registry: SessionRegistry | None = None,
                     writers: WriterRecords | None = None) -> ErasureReceipt:
    """Erase ``user_id`` from the service and her memory (module notes)."""
    user = erased_user_id(user_id)
    store = memory.store
    sessions = registry if registry is not None else SessionRegistry(store)
    written = writers if writers is not None else WriterRecords(store)
    receipt = ErasureReceipt(user, time.time(), dry_run)
    receipt = receipt.adding(tokens=await _tokens(memory, user, dry_run))
    receipt = await _owned(memory, sessions, user, dry_run, receipt)
    receipt = receipt.adding(viewer_links=await _viewed(sessions, user, dry_run))
    receipt = receipt.adding(writer_records=await written.erase(user, dry_run=dry_run))
    if not dry_run:
        await announce(store)
    mine = await memory.erase_user(user, dry_run=dry_run)
    receipt = receipt.adding(**{kind: getattr(mine, kind) for kind in
                                ("conversations", "values", "messages", "idempotency_records")})
    log(receipt, "everywhere")
    return receipt


async def _tokens(memory: AsyncMemory, user: str, dry_run: bool) -> int:
    store, found = memory.store, 0
    after: str | None = None
    while digests := await store.keys(RESERVED_SCOPE, "tokens", after=after, limit=500):
        for digest in digests:
            ok, value = await store.read(reserved("tokens", digest))
            record = as_mapping(value) if ok else None
            if record is not None and record.get("user_id") == user:
                found += 1
                if not dry_run:
                    await store.delete(reserved("tokens", digest))
        after = digests[-1]
    if found and not dry_run:
        await announce(store)  # every process drops her cached tokens now
    return found


async def _owned(memory: AsyncMemory, sessions: SessionRegistry, user: str, dry_run: bool,
                 receipt: ErasureReceipt) -> ErasureReceipt:
    store = memory.store
    for session_id in await sessions.ids(f"owner/{user}"):
        record = await sessions.load(session_id)
        if record is not None and record.owner == user:
            receipt = receipt.adding(sessions=1, viewer_links=len(record.viewers))
            if not dry_run:
                await sessions.set_status(session_id, "stopped")  # no new turn starts
                for viewer in record.viewers:
                    await store.delete(reserved(f"viewer/{viewer}", session_id))
            receipt = receipt.adding(await store.erase("session", session_id, dry_run=dry_run))
            if not dry_run:
                await store.delete(reserved("sessions", session_id))
                sessions.forget(session_id)
        if not dry_run:
            await store.delete(reserved(f"owner/{user}", session_id))
    return receipt


async def _viewed(sessions: SessionRegistry, user: str, dry_run: bool) -> int:
    links = await sessions.ids(f"viewer/{user}")
    if dry_run:
        return len(links)
    for session_id in links:
        await sessions.update(session_id, lambda r: dataclasses.replace(
            r, viewers=r.viewers - {user}))
        await sessions.store.delete(reserved(f"viewer/{user}", session_id))
    return len(links)
