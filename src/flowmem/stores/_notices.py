"""Change notices between serving processes, pushed by the store (no read per request).

A store that offers ``notices()`` returns a :class:`NoticeFeed`: PostgreSQL
LISTEN/NOTIFY on one dedicated connection per process
(:mod:`flowmem.stores.postgres._notices`), Redis pub/sub
(:mod:`flowmem.stores.redis._notices`). :class:`flowmem.service._changes.Changes`
follows it: while the feed is connected a request is served with no store
read of the shared changes record; a (re)connection forgets everything cached
(a notice may have been missed while it was down); while it is down the
process falls back to the shared record's read per request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["NoticeFeed", "feed_of"]


class NoticeFeed(Protocol):
    """One process's end of the store's change notices."""

    async def publish(self, payload: str) -> None:
        """Send ``payload`` to every process following the feed (this one too)."""
        ...

    async def follow(self, connected: Callable[[], None], notice: Callable[[str], None],
                     lost: Callable[[], None]) -> None:
        """Run until cancelled: ``connected()`` each time the feed is (re)subscribed,
        ``notice(payload)`` per notice, ``lost()`` when the subscription drops
        (then reconnect, with a bounded backoff)."""
        ...


def feed_of(store: Any) -> NoticeFeed | None:
    """The notice feed of an asyncio store, or ``None`` (the shared record's read then)."""
    module = type(store).__module__
    if module == "flowmem.stores.postgres._replicas":
        store = store.primary
        module = type(store).__module__
    if module == "flowmem.stores.postgres._async":
        from .postgres._notices import PostgresNotices

        return PostgresNotices.of(store)
    if module.startswith("flowmem.stores.redis."):
        from .redis._notices import RedisNotices

        return RedisNotices.of(store)
    return None
