"""What the service may keep in memory between requests, and when it must forget it.

Every request used to read its token's record and its session's record from
the store: two store calls before any work (on SQLite, two transactions on
the one connection thread). A verified token and a loaded session record are
now kept in the process (:class:`LocalCache`), and are forgotten:

- **in this process, at once**: a token revoked, a session stopped, reset,
  granted or revoked through this process's :class:`~.auth.TokenBackend` or
  :class:`~.sessions.SessionRegistry` replaces or drops its entry before the
  change answers;
- **in every other process, before its next request is served**: every such
  change, whatever process makes it (``flowmem token revoke``, ``flowmem
  sessions stop``, another server), ends by writing a new random value to
  one record of the store, :data:`CHANGES_KEY` (:func:`announce`). A request
  is served only after a read of that record that STARTED after the request
  arrived (:meth:`Changes.settle`); a new value empties both caches. Reads
  are shared: a request that arrives while a read is running waits for the
  next one, so under load one read serves every request that arrived during
  the previous one (one read per store round trip, not per request).
  On PostgreSQL and (standalone) Redis the record is not read per request:
  each process follows the store's change notices instead (LISTEN/NOTIFY,
  pub/sub; :mod:`flowmem.stores._notices`), and :func:`announce` publishes
  one after writing the record. While the feed is connected a request is
  served with no store read (the change is seen once its notice arrives,
  milliseconds after the change's commit); each (re)connection forgets
  everything cached (a notice may have been missed), and while the feed is
  down the process reads the record per request as above. SQLite (one
  machine) keeps the shared read.
- **after** :data:`MAX_AGE` **seconds in any case**: the backstop for a
  process that died (or lost the store) between its change and its announcement.

A fill that raced a change is never kept (:meth:`LocalCache.put` checks
the epoch the fill began under). Expiry (``expires_at``) is checked on every
use of a cached token.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Hashable
from contextlib import suppress
from contextvars import ContextVar
from typing import Any, Final, Generic, TypeVar

from ..store import AsyncStore
from ..stores._notices import NoticeFeed, feed_of
from ._registry import reserved

__all__ = ["ARRIVED", "CHANGES_KEY", "MAX_AGE", "MAX_ENTRIES", "Changes", "LocalCache",
           "announce"]

CHANGES_KEY: Final = reserved("meta", "changes")
MAX_AGE: Final = 30.0
"""Seconds an entry is kept at most (only matters if an announcement was lost)."""
MAX_ENTRIES: Final = 10_000

ARRIVED: ContextVar[float | None] = ContextVar("flowmem_arrived", default=None)
"""When the request being served arrived (``time.monotonic()``; set by ``deps.caller``)."""

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


async def announce(store: AsyncStore) -> None:
    """Tell every process serving ``store`` to forget what it keeps (after a change): the
    shared record (read by processes whose feed is down), then the notice."""
    value = uuid.uuid4().hex
    await store.write(CHANGES_KEY, value)
    feed = feed_of(store)
    if feed is not None:
        await feed.publish(value)


class LocalCache(Generic[K, V]):
    """A bounded map whose fills cannot resurrect what an invalidation removed."""

    def __init__(self, max_age: float = MAX_AGE, max_entries: int = MAX_ENTRIES) -> None:
        self.max_age = max_age
        self.max_entries = max_entries
        self.epoch = 0
        self._entries: dict[K, tuple[float, V]] = {}

    def get(self, key: K) -> V | None:
        """The entry, if it is younger than ``max_age``."""
        found = self._entries.get(key)
        if found is None:
            return None
        if time.monotonic() - found[0] >= self.max_age:
            del self._entries[key]
            return None
        return found[1]

    def put(self, key: K, value: V, epoch: int) -> None:
        """Keep ``value`` if nothing was invalidated since ``epoch`` (read it before the
        store read the value came from)."""
        if epoch != self.epoch:
            return
        if len(self._entries) >= self.max_entries:
            self._entries.clear()
        self._entries[key] = (time.monotonic(), value)

    def replace(self, key: K, value: V | None) -> None:
        """This process changed ``key``: keep ``value`` (``None``: drop it), and let no
        fill begun before the change keep an older value."""
        self.epoch += 1
        if value is None:
            self._entries.pop(key, None)
        else:
            self._entries[key] = (time.monotonic(), value)

    def clear(self) -> None:
        """Forget everything (another process announced a change)."""
        self.epoch += 1
        self._entries.clear()


class Changes:
    """The caches of one app and the shared read of :data:`CHANGES_KEY` (module notes)."""

    def __init__(self, store: AsyncStore, max_age: float = MAX_AGE) -> None:
        self.store = store
        self.tokens: LocalCache[str, Any] = LocalCache(max_age)
        self.sessions: LocalCache[str, Any] = LocalCache(max_age)
        self._seen: Any = None
        self._settled_from = float("-inf")  # when the newest finished read began
        self._running: asyncio.Task[None] | None = None
        self._running_from = 0.0
        self._feed: NoticeFeed | None = feed_of(store)
        self._follower: asyncio.Task[None] | None = None
        self.live = False
        """Whether the notice feed is connected (no read per request)."""

    def _follow(self) -> None:
        feed = self._feed
        if feed is None or self._follower is not None:
            return
        self._follower = asyncio.get_running_loop().create_task(
            feed.follow(self._connected, self._notice, self._lost))

    def _connected(self) -> None:
        self.tokens.clear()
        self.sessions.clear()
        self.live = True

    def _notice(self, _: str) -> None:
        self.tokens.clear()
        self.sessions.clear()

    def _lost(self) -> None:
        self.live = False
        self._settled_from = float("-inf")  # read the shared record again before serving
        self.tokens.clear()
        self.sessions.clear()

    async def aclose(self) -> None:
        """Stop following the notice feed."""
        follower, self._follower = self._follower, None
        if follower is not None:
            follower.cancel()
            with suppress(asyncio.CancelledError):
                await follower

    async def settle(self, since: float | None = None) -> None:
        """Return once a read of :data:`CHANGES_KEY` begun at or after ``since``
        (``time.monotonic()``; default: when the request arrived, :data:`ARRIVED`,
        else now) has been applied to the caches. While the notice feed is connected
        there is nothing to read."""
        self._follow()
        if self.live:
            return
        if since is None:
            since = ARRIVED.get()
            if since is None:
                since = time.monotonic()
        while self._settled_from < since:
            running = self._running
            if running is None:
                self._running_from = time.monotonic()
                running = self._running = asyncio.create_task(self._read(self._running_from))
            await asyncio.shield(running)

    async def _read(self, began: float) -> None:
        try:
            found, value = await self.store.read(CHANGES_KEY)
            current = value if found else None
            if current != self._seen:
                self._seen = current
                self.tokens.clear()
                self.sessions.clear()
            self._settled_from = max(self._settled_from, began)
        finally:
            self._running = None
