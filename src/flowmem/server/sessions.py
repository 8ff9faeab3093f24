"""The session registry, persisted through the store's key-value API.

Records live under the reserved scope (:mod:`flowmem.server.registry`):

==========================  ======================  ==========================
scope id                    key                     value
==========================  ======================  ==========================
``sessions``                session id              the :class:`SessionRecord`
``owner/<user id>``         session id              ``true`` (list mine)
``viewer/<user id>``        session id              ``true`` (shared with me)
==========================  ======================  ==========================

A session's conversation is an ordinary GR-MEM conversation: scope
``session``, scope id the session id, key :data:`TRANSCRIPT_KEY`, appended
through :meth:`flowmem.AsyncMemory.append` with the MEM-8 memory principal.
Updates of a record are serialized by the store's per-key lock (behind an
in-process lock per key, :class:`~.registry.KeyLocks`). A serving process
keeps loaded records in memory (:meth:`SessionRegistry.cached`, :mod:`.changes`):
an update through this registry replaces its entry at once, and a stop, reset,
grant or revoke of view is announced to every other process
(:func:`~.changes.announce`). Every method is a coroutine over an
:class:`~flowmem.store.AsyncStore`.
"""

from __future__ import annotations

import dataclasses
import re
import time
import uuid
from collections.abc import Callable
from typing import Final

from ..access import SESSION_STATUSES, SessionRecord, memory_principal
from ..errors import KeyConflict, StoreBusy
from ..scopes import ExecutionContext, StorageKey
from ..store import AsyncStore
from .changes import Changes, announce
from .registry import RESERVED_SCOPE, KeyLocks, as_mapping, reserved

__all__ = ["TRANSCRIPT_KEY", "SessionRegistry", "session_context"]

TRANSCRIPT_KEY: Final = "transcript"
_SESSIONS: Final = "sessions"
_ID: Final = re.compile(r"[0-9a-f]{32}")
_LOCK_TIMEOUT: Final = 30.0  # a record update waits this long for its lock, then 503 store_busy


def session_context(session: SessionRecord, **ids: str | None) -> ExecutionContext:
    """The execution context of a session-driven operation (MEM-8).

    ``user_id`` is the session OWNER's id when it is a usable id (else the
    ``user`` scope is refused), never the caller's; ``session_id`` is the
    session's own id. ``ids`` are the workflow/pipeline/execution/node ids.
    """
    return ExecutionContext(user_id=memory_principal(session), session_id=session.id, **ids)


class SessionRegistry:
    """Create, load, update and list sessions in a store."""

    def __init__(self, store: AsyncStore, changes: Changes | None = None) -> None:
        self.store = store
        self.changes = changes
        self._locks = KeyLocks()

    async def create(self, owner: str | None, title: str) -> SessionRecord:
        """A new session (server-made id) owned by ``owner`` (``None``: owner-less)."""
        now = time.time()
        record = SessionRecord(id=uuid.uuid4().hex, owner=owner, title=title,
                               created_at=now, updated_at=now)
        await self._save(record)
        if record.owner is not None:
            await self.store.write(reserved(f"owner/{record.owner}", record.id), True)
        return record

    async def load(self, session_id: str) -> SessionRecord | None:
        """The session, or ``None`` when the id is malformed, unknown or unreadable."""
        if not isinstance(session_id, str) or not _ID.fullmatch(session_id):
            return None
        found, value = await self.store.read(reserved(_SESSIONS, session_id))
        record = as_mapping(value) if found else None
        if record is None:
            return None
        try:
            loaded = SessionRecord.from_json(record)
        except (KeyError, TypeError, ValueError):
            return None
        if loaded.status not in SESSION_STATUSES:  # a record from before STORE-11/12
            loaded = dataclasses.replace(loaded, status=await self._legacy_status(loaded))
        return loaded

    async def cached(self, session_id: str) -> SessionRecord | None:
        """As :meth:`load`, from memory when this process may keep records (module notes)."""
        changes = self.changes
        if changes is None:
            return await self.load(session_id)
        await changes.settle()
        kept: SessionRecord | None = changes.sessions.get(session_id)
        if kept is not None:
            return kept
        epoch = changes.sessions.epoch
        loaded = await self.load(session_id)
        if loaded is not None:
            changes.sessions.put(session_id, loaded, epoch)
        return loaded

    async def _legacy_status(self, record: SessionRecord) -> str:
        """``active`` (the old spelling): ``completed`` if a turn was stored, else ``idle``."""
        transcript = StorageKey("session", record.id, TRANSCRIPT_KEY)
        try:
            ran = bool((await self.store.history(transcript, last=1)).positions)
        except KeyConflict:
            ran = True
        return "completed" if ran else "idle"

    async def update(self, session_id: str,
               change: Callable[[SessionRecord], SessionRecord]) -> SessionRecord | None:
        """Read-modify-write one record under its lock; ``None`` if it is gone."""
        key = reserved(_SESSIONS, session_id)
        async with self._locks.hold(self.store, key, _LOCK_TIMEOUT) as held:
            if not held:
                raise StoreBusy(f"session {session_id} stayed locked past {_LOCK_TIMEOUT}s")
            current = await self.load(session_id)
            if current is None:
                self._keep(session_id, None)
                return None
            changed = dataclasses.replace(change(current), updated_at=time.time())
            try:
                await self._save(changed)
            except BaseException:  # landed or not: keep nothing, the next use reads
                self._keep(session_id, None)
                raise
            self._keep(session_id, changed)
            return changed

    def _keep(self, session_id: str, record: SessionRecord | None) -> None:
        if self.changes is not None:
            self.changes.sessions.replace(session_id, record)

    async def set_status(self, session_id: str, status: str) -> SessionRecord | None:
        """Set the session's status (one of :data:`~flowmem.access.SESSION_STATUSES`)."""
        if status not in SESSION_STATUSES:
            raise ValueError(f"unknown session status {status!r}")
        updated = await self.update(session_id, lambda r: dataclasses.replace(r, status=status))
        await announce(self.store)
        return updated

    async def turn_finished(self, record: SessionRecord) -> SessionRecord:
        """After a turn: an ``idle`` session becomes ``completed`` (STORE-12)."""
        if record.status != "idle":
            return record
        return await self.update(record.id, lambda r: dataclasses.replace(
            r, status="completed" if r.status == "idle" else r.status)) or record

    async def grant(self, session_id: str, viewer: str) -> SessionRecord | None:
        """Let ``viewer`` view the session (never drive it, MEM-9)."""
        updated = await self.update(session_id, lambda r: dataclasses.replace(
            r, viewers=r.viewers | {viewer}))
        if updated is not None:
            await self.store.write(reserved(f"viewer/{viewer}", session_id), True)
        await announce(self.store)
        return updated

    async def revoke(self, session_id: str, viewer: str) -> SessionRecord | None:
        """Take view back from ``viewer``."""
        updated = await self.update(session_id, lambda r: dataclasses.replace(
            r, viewers=r.viewers - {viewer}))
        if updated is not None:
            await self.store.delete(reserved(f"viewer/{viewer}", session_id))
        await announce(self.store)
        return updated

    async def listing(self, user_id: str, relation: str, *, offset: int,
                limit: int) -> tuple[list[SessionRecord], int]:
        """A page of the sessions ``user_id`` owns (``relation="owner"``) or may view
        (``"viewer"``), oldest id first, and the total under that filter (API-6).

        The total counts the user's index; a record that no longer says so
        (a concurrent revoke) is left out of the page.
        """
        ids = await self._index(f"{relation}/{user_id}")
        loaded = [await self.load(i) for i in ids[offset:offset + limit]]
        page = [r for r in loaded if r is not None and _relates(r, user_id, relation)]
        return page, len(ids)

    async def _index(self, scope_id: str) -> list[str]:
        found: list[str] = []
        after: str | None = None
        while batch := await self.store.keys(RESERVED_SCOPE, scope_id, after=after, limit=500):
            found += batch
            after = batch[-1]
        return found

    async def _save(self, record: SessionRecord) -> None:
        await self.store.write(reserved(_SESSIONS, record.id), record.to_json())


def _relates(record: SessionRecord, user_id: str, relation: str) -> bool:
    if relation == "owner":
        return record.owner == user_id
    return user_id in record.viewers
