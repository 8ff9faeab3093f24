"""Read replicas with read-your-writes: ``postgresql://primary/db?replica=postgresql://r1/db``.

``replica`` may be given more than once. Writes (append, write, delete, edit,
the service's record changes, locks) always go to the primary; after each one
the store notes the primary's WAL position (``pg_current_wal_lsn()``, read
after the commit: at or past it). A read, a history page or a key listing goes
to a replica (in turn) once that replica has replayed at least the noted
position (``pg_last_wal_replay_lsn()``), waiting at most ``replica_wait``
seconds (default 1) for it; else — or when the replica fails — to the
primary. So a caller never misses its own acknowledged append, whichever
replica serves it. The service's own records (tokens, sessions) are always
read from the primary: another process's revoke is never read back stale.
The other options of the URL (schema, timeouts, prepared, pools) apply to
every replica; a replica is never migrated.

The asyncio face only (``flowmem serve``, :class:`~flowmem.AsyncMemory`): the
blocking face refuses ``replica=`` with the reason.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ...errors import InvalidStoreURL, StoreError
from ...messages import Message
from ...scopes import StorageKey
from ...store import AppendOutcome, DeleteOutcome, Erased, HistoryPage, Idempotency
from .._modify import Change
from ..sql._program import Batch, Program
from ._async import AsyncPostgresStore

__all__ = ["AsyncReplicaRouted", "split_replicas"]

_WAIT: Final = 1.0
_POLL: Final = (0.002, 0.005, 0.01, 0.02, 0.05)
_ROUTING: Final = ("replica", "replica_wait")
_SERVICE: Final = "_flowmem"
"""The service's own records (tokens, sessions, the changes record) are read from the
primary: another process's revoke must never be read back stale from a lagging replica."""


def split_replicas(url: str) -> tuple[str, list[str], float]:
    """``(primary URL, replica URLs, replica_wait)``: the replica options taken out."""
    parts = urlsplit(url)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    kept = [(k, v) for k, v in pairs if k not in _ROUTING]
    replicas = [v for k, v in pairs if k == "replica"]
    waits = [v for k, v in pairs if k == "replica_wait"]
    try:
        wait = float(waits[-1]) if waits else _WAIT
    except ValueError:
        raise InvalidStoreURL(f"replica_wait must be seconds, got {waits[-1]!r}") from None
    if not wait >= 0 or wait == float("inf"):
        raise InvalidStoreURL(f"replica_wait must be finite seconds >= 0, got {wait}")
    primary = urlunsplit(parts._replace(query=urlencode(kept)))
    shared = [(k, v) for k, v in kept if k in ("schema", "prepared", "statement_timeout",
                                                "pool_min", "pool_max", "pool_timeout")]
    routed = []
    for replica in replicas:
        given = urlsplit(replica)
        if given.scheme.lower() not in ("postgresql", "postgres"):
            raise InvalidStoreURL(f"a replica must be a postgresql:// URL, got {replica!r}")
        own = parse_qsl(given.query, keep_blank_values=True)
        names = {k for k, _ in own}
        query = urlencode(own + [(k, v) for k, v in shared if k not in names])
        routed.append(urlunsplit(given._replace(query=query)))
    return primary, routed, wait


def _current_lsn() -> Program[str]:
    rows = yield Batch((("SELECT pg_current_wal_lsn()::text", ()),), final=True)
    return str(rows[0][0][0])


def _replayed(lsn: str) -> Program[bool]:
    rows = yield Batch((("SELECT coalesce(pg_last_wal_replay_lsn() >= ?::pg_lsn, false)",
                         (lsn,)),), final=True)
    return bool(rows[0][0][0])


class AsyncReplicaRouted:
    """The asyncio PostgreSQL store with read replicas (see the module notes)."""

    def __init__(self, primary: AsyncPostgresStore, replicas: Sequence[AsyncPostgresStore],
                 wait: float = _WAIT) -> None:
        self.primary = primary
        self.replicas = list(replicas)
        for replica in self.replicas:
            replica._set_up = True  # a standby is read-only: never migrated
        self.wait = wait
        self.routed = {"replica": 0, "primary": 0}
        """How many reads each side served (for tests and the bench)."""
        self._lsn: str | None = None
        self._turn = itertools.cycle(range(len(self.replicas)))

    @classmethod
    def from_url(cls, url: str) -> AsyncReplicaRouted:
        primary, replicas, wait = split_replicas(url)
        return cls(AsyncPostgresStore.from_url(primary),
                   [AsyncPostgresStore.from_url(r) for r in replicas], wait)

    def __getattr__(self, name: str) -> Any:  # schema, read_only, ... of the primary
        return getattr(self.primary, name)

    # -- writes: the primary, then its WAL position ------------------------------------
    async def _written(self) -> None:
        if self.replicas:
            self._lsn = await self.primary._value(_current_lsn)

    async def write(self, key: StorageKey, value: Any, *,
                    idempotency: Idempotency | None = None, replace: bool = False) -> bool:
        try:
            return await self.primary.write(key, value, idempotency=idempotency,
                                            replace=replace)
        finally:
            await self._written()

    async def delete(self, key: StorageKey, *,
                     idempotency: Idempotency | None = None) -> DeleteOutcome:
        try:
            return await self.primary.delete(key, idempotency=idempotency)
        finally:
            await self._written()

    async def append(self, key: StorageKey, incoming: Sequence[Message], *,
                     max_messages: int | None, lock_timeout: float,
                     idempotency: Idempotency | None = None, tail: int = 0) -> AppendOutcome:
        try:
            return await self.primary.append(key, incoming, max_messages=max_messages,
                                             lock_timeout=lock_timeout,
                                             idempotency=idempotency, tail=tail)
        finally:
            await self._written()

    async def edit(self, key: StorageKey, position: int, message: Message | None) -> bool:
        try:
            return await self.primary.edit(key, position, message)
        finally:
            await self._written()

    async def erase(self, scope: str, scope_id: str, *, dry_run: bool = False) -> Erased:
        """On the primary (a dry run too: it counts what the primary holds)."""
        try:
            return await self.primary.erase(scope, scope_id, dry_run=dry_run)
        finally:
            await self._written()

    async def modify(self, key: StorageKey, change: Change, timeout: float) -> tuple[bool, Any]:
        try:
            return await self.primary.modify(key, change, timeout)
        finally:
            await self._written()

    def lock(self, key: StorageKey, timeout: float) -> AbstractAsyncContextManager[bool]:
        return self.primary.lock(key, timeout)

    # -- reads: a replica that has replayed this store's last write ----------------------
    async def _reader(self) -> AsyncPostgresStore:
        if not self.replicas:
            return self.primary
        replica = self.replicas[next(self._turn)]
        lsn = self._lsn
        if lsn is None:
            return replica
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait
        for attempt in itertools.count():
            try:
                if await replica._value(lambda: _replayed(lsn), read_only=True):
                    return replica
            except StoreError:
                return self.primary
            if loop.time() >= deadline:
                return self.primary
            await asyncio.sleep(_POLL[min(attempt, len(_POLL) - 1)])
        raise AssertionError("unreachable")

    async def _routed(self, call: Any, scope: str) -> Any:
        reader = self.primary if scope == _SERVICE else await self._reader()
        if reader is not self.primary:
            try:
                answer = await call(reader)
            except StoreError:
                pass  # the replica failed: the primary answers
            else:
                self.routed["replica"] += 1
                return answer
        self.routed["primary"] += 1
        return await call(self.primary)

    async def read(self, key: StorageKey) -> tuple[bool, Any]:
        answer: tuple[bool, Any] = await self._routed(lambda s: s.read(key), key.scope)
        return answer

    async def history(self, key: StorageKey, *, last: int | None = None,
                      before: int | None = None) -> HistoryPage:
        answer: HistoryPage = await self._routed(
            lambda s: s.history(key, last=last, before=before), key.scope)
        return answer

    async def keys(self, scope: str, scope_id: str, *, prefix: str = "",
                   after: str | None = None, limit: int = 100) -> list[str]:
        answer: list[str] = await self._routed(
            lambda s: s.keys(scope, scope_id, prefix=prefix, after=after, limit=limit), scope)
        return answer

    async def aclose(self) -> None:
        for store in (self.primary, *self.replicas):
            await store.aclose()
