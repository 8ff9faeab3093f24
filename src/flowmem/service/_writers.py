"""Who last wrote each shared-scope value through the service: records of the reserved scope.

A value in a shared scope (``global``, ``workflow``, ``pipeline``,
``execution``) answers a read with ``written_by``, the user whose token last
wrote it through the service (``"anonymous"`` without one). The record is a
plain value of the reserved scope, written after the value itself, and
listed under its writer (``wrote/<user id>``, the key the JSON of ``[scope,
scope id, key]``) so that erasing a user (:mod:`._erasure`) finds the records
naming her: they are deleted (the shared value stays: it is not hers alone,
and ``written_by`` then reads ``null``). An index entry whose record names
someone else by now is dropped with it.
"""

from __future__ import annotations

import json
import time

from ..access import SHARED_SCOPES, Principal
from ..scopes import StorageKey
from ..store import AsyncStore
from ._registry import RESERVED_SCOPE, as_mapping, reserved

__all__ = ["WriterRecords"]


def _side(scope: str, scope_id: str, key: str) -> StorageKey:
    return reserved(f"writer/{scope}/{scope_id}", key)


def _listed(user: str, scope: str, scope_id: str, key: str) -> StorageKey:
    return reserved(f"wrote/{user}", json.dumps([scope, scope_id, key]))


class WriterRecords:
    """The writer records of one store."""

    def __init__(self, store: AsyncStore) -> None:
        self.store = store

    async def record(self, scope: str, scope_id: str, key: str, principal: Principal) -> None:
        """Remember who last wrote the shared-scope value at (scope, scope id, key)."""
        if scope in SHARED_SCOPES:
            who = principal.user_id if principal.user_id is not None else "anonymous"
            if principal.user_id is not None:
                await self.store.write(_listed(who, scope, scope_id, key), True)
            await self.store.write(_side(scope, scope_id, key),
                                   {"user_id": who, "admin": principal.admin, "at": time.time()})

    async def forget(self, scope: str, scope_id: str, key: str) -> None:
        """Drop the writer record of a deleted shared-scope key."""
        if scope in SHARED_SCOPES:
            await self.store.delete(_side(scope, scope_id, key))

    async def of(self, scope: str, scope_id: str, key: str) -> str | None:
        """Who last wrote the shared-scope value through the service (``None``: unknown)."""
        if scope not in SHARED_SCOPES:
            return None
        found, value = await self.store.read(_side(scope, scope_id, key))
        record = as_mapping(value) if found else None
        user = record.get("user_id") if record is not None else None
        return user if isinstance(user, str) else None

    async def erase(self, user: str, *, dry_run: bool = False) -> int:
        """Delete the records naming ``user`` as the last writer (``dry_run``: count
        them); how many there were."""
        found = 0
        after: str | None = None
        while listed := await self.store.keys(RESERVED_SCOPE, f"wrote/{user}", after=after,
                                              limit=500):
            for entry in listed:
                scope, scope_id, key = json.loads(entry)
                if await self.of(scope, scope_id, key) == user:
                    found += 1
                    if not dry_run:
                        await self.forget(scope, scope_id, key)
                if not dry_run:
                    await self.store.delete(reserved(f"wrote/{user}", entry))
            after = listed[-1]
        return found
