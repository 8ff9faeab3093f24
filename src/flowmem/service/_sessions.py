"""The session registry, persisted through the store's key-value API.

Records live under the reserved scope (:mod:`flowmem.service._registry`):

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
An update of a record is one atomic read-modify-write (:mod:`._records`: on
PostgreSQL one transaction on one connection; elsewhere under the store's
per-key lock), behind an in-process queue per key. A serving process
keeps loaded records in memory (:meth:`SessionRegistry.cached`, :mod:`.changes`):
an update through this registry replaces its entry at once, and a stop, reset,
grant or revoke of view is announced to every other process
(:func:`~.changes.announce`). Every method is a coroutine over an
:class:`~flowmem.store.AsyncStore`.

Retention. Under a policy for the ``session`` scope (the memory's
``retention``, decided on its ``clock``) a session expires with its
conversation: it is expired once its transcript reads as absent AND its
record has gone the policy's time unchanged (idle: since ``updated_at``,
which a turn moves at most every half policy; absolute: since
``created_at``) — so a session is never lost while its transcript lives,
and one without a turn lives the policy's time. An expired session loads as
unknown at once (:meth:`SessionRegistry.load`, listings); :meth:`SessionRegistry.sweep`
deletes its record and its owner and viewer entries.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
import uuid
from collections.abc import Callable
from typing import Any, Final

from ..access import SESSION_STATUSES, SessionRecord, memory_principal
from ..async_memory import AsyncMemory
from ..errors import KeyConflict
from ..retention import Policy, Retention
from ..scopes import ExecutionContext, StorageKey
from ..store import AsyncStore
from ._changes import Changes, announce
from ._records import KEEP, modify
from ._registry import RESERVED_SCOPE, KeyLocks, as_mapping, reserved

__all__ = ["TRANSCRIPT_KEY", "SessionRegistry", "clear_memory", "session_context"]

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


async def clear_memory(memory: AsyncMemory, record: SessionRecord) -> None:
    """Delete every key of the session's scope: its conversation and its session memory
    (a reset: the HTTP service's and the CLI's alike)."""
    context = session_context(record)
    after: str | None = None
    while keys := await memory.keys("session", context=context, after=after, limit=100):
        for key in keys:
            await memory.delete("session", key, context=context)
        after = keys[-1]


class SessionRegistry:
    """Create, load, update and list sessions in a store."""

    def __init__(self, store: AsyncStore, changes: Changes | None = None, *,
                 retention: Retention | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        """``retention`` and ``clock``: the memory's (a policy for ``session`` expires
        sessions with their conversations; see the module notes)."""
        self.store = store
        self.changes = changes
        self.clock = clock
        self.policy: Policy | None = (None if retention is None
                                      else retention.policies.get("session"))
        self._locks = KeyLocks()

    async def create(self, owner: str | None, title: str) -> SessionRecord:
        """A new session (server-made id) owned by ``owner`` (``None``: owner-less)."""
        now = self.clock()
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
        loaded = _parsed(value) if found else None
        if loaded is None or await self.expired(loaded):
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
            return None if await self.expired(kept) else kept
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
        """Read-modify-write one record atomically (:mod:`._records`: on PostgreSQL one
        transaction on one connection); ``None`` if it is gone."""
        key = reserved(_SESSIONS, session_id)
        legacy: str | None = None
        changed: list[SessionRecord | None] = [None]

        def apply(found: bool, value: Any) -> Any:
            changed[0] = None
            record = _parsed(value) if found else None
            if record is None:
                return KEEP
            if record.status not in SESSION_STATUSES:  # a record from before STORE-11/12
                if legacy is None:
                    raise _Legacy(record)
                record = dataclasses.replace(record, status=legacy)
            new = dataclasses.replace(change(record), updated_at=self.clock())
            changed[0] = new
            return new.to_json()

        for _ in range(2):
            try:
                await modify(self.store, self._locks, key, apply, _LOCK_TIMEOUT)
            except _Legacy as old:  # its status is worked out from its transcript, outside
                legacy = await self._legacy_status(old.record)
                continue
            except BaseException:  # landed or not: keep nothing, the next use reads
                self._keep(session_id, None)
                raise
            break
        self._keep(session_id, changed[0])
        return changed[0]

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
        """After a turn: an ``idle`` session becomes ``completed`` (STORE-12); under an
        idle policy the record is kept fresh (``updated_at`` moved every half policy)."""
        policy = self.policy
        if (record.status != "idle" and policy is not None and not policy.absolute
                and record.updated_at + policy.seconds / 2 <= self.clock()):
            return await self.update(record.id, lambda r: r) or record
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

    async def every(self) -> list[SessionRecord]:
        """Every session (the ids read in pages, then each record): the CLI's listing."""
        loaded = [await self.load(i) for i in await self._index(_SESSIONS)]
        return [r for r in loaded if r is not None]

    async def ids(self, index: str) -> list[str]:
        """The session ids of one index of the reserved scope (``owner/<user>``,
        ``viewer/<user>``), read in pages."""
        return await self._index(index)

    def forget(self, session_id: str) -> None:
        """Keep nothing of a session deleted by this process (:mod:`._erasure`)."""
        self._keep(session_id, None)

    async def _index(self, scope_id: str) -> list[str]:
        found: list[str] = []
        after: str | None = None
        while batch := await self.store.keys(RESERVED_SCOPE, scope_id, after=after, limit=500):
            found += batch
            after = batch[-1]
        return found

    # -- retention -------------------------------------------------------------------
    async def expired(self, record: SessionRecord) -> bool:
        """Whether the session expired with its conversation (module notes): its record's
        time under the policy has passed and its transcript reads as absent."""
        policy = self.policy
        if policy is None:
            return False
        now = self.clock()
        since = record.created_at if policy.absolute else record.updated_at
        if since + policy.seconds > now:
            return False
        transcript = StorageKey("session", record.id, TRANSCRIPT_KEY)
        try:  # a store that keeps retention takes the instant (retention.check_retention)
            page = await self.store.history(transcript, last=1, now=now)  # type: ignore[call-arg]
        except KeyConflict:
            return False
        return not page.positions

    async def sweep(self, batch: int = 100) -> int:
        """Delete the records, owner and viewer entries of expired sessions (the ids read
        ``batch`` at a time); how many sessions. Nothing without a ``session`` policy."""
        if self.policy is None:
            return 0
        removed = 0
        after: str | None = None
        while ids := await self.store.keys(RESERVED_SCOPE, _SESSIONS, after=after, limit=batch):
            after = ids[-1]
            await asyncio.sleep(0)  # requests waiting on the loop go first, page by page
            for session_id in ids:
                found, value = await self.store.read(reserved(_SESSIONS, session_id))
                record = _parsed(value) if found else None
                if record is not None and await self.expired(record):
                    await self._forget(record)
                    removed += 1
        return removed

    async def _forget(self, record: SessionRecord) -> None:
        """Delete an expired session's index entries, then its record (so a failure half
        way leaves the record, and the next sweep finishes)."""
        for viewer in sorted(record.viewers):
            await self.store.delete(reserved(f"viewer/{viewer}", record.id))
        if record.owner is not None:
            await self.store.delete(reserved(f"owner/{record.owner}", record.id))
        await self.store.delete(reserved(_SESSIONS, record.id))
        self._keep(record.id, None)

    async def _save(self, record: SessionRecord) -> None:
        await self.store.write(reserved(_SESSIONS, record.id), record.to_json())


class _Legacy(Exception):
    """A record's status must be worked out from its transcript before it is changed."""

    def __init__(self, record: SessionRecord) -> None:
        super().__init__(record.id)
        self.record = record


def _parsed(value: Any) -> SessionRecord | None:
    """The stored record, or ``None`` when it is not one."""
    record = as_mapping(value)
    if record is None:
        return None
    try:
        return SessionRecord.from_json(record)
    except (KeyError, TypeError, ValueError):
        return None


def _relates(record: SessionRecord, user_id: str, relation: str) -> bool:
    if relation == "owner":
        return record.owner == user_id
    return user_id in record.viewers
