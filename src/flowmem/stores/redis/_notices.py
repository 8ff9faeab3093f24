"""Redis pub/sub for the service's change notices (:mod:`flowmem.stores._notices`).

``publish`` is one ``PUBLISH`` on the store's client; ``follow`` subscribes on a
connection of its own (redis-py's ``pubsub()``), on the store's prefix's
channel. A Redis Cluster store has no feed here (its processes read the shared
changes record per request, as before).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import suppress
from typing import Any, Final

__all__ = ["RedisNotices"]

logger = logging.getLogger("flowmem")
_BACKOFF: Final = (0.05, 0.2, 1.0, 2.0)


class RedisNotices:
    """The notice feed of one standalone Redis store."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._channel = f"{store.prefix}:changes".encode("utf-8", "surrogatepass")

    @classmethod
    def of(cls, store: Any) -> RedisNotices | None:
        """The feed of an :class:`~flowmem.stores.redis.AsyncRedisStore` (``None`` on a
        cluster)."""
        if store.cluster or not hasattr(store._driver.client, "pubsub"):
            return None
        return cls(store)

    async def publish(self, payload: str) -> None:
        await self._store._driver.client.publish(self._channel, payload.encode())

    async def follow(self, connected: Callable[[], None], notice: Callable[[str], None],
                     lost: Callable[[], None]) -> None:
        import redis.exceptions

        failures = 0
        while True:
            if self._store.cluster:  # detected on first use: no feed after all
                lost()
                return
            pubsub = self._store._driver.client.pubsub()
            try:
                await pubsub.subscribe(self._channel)
                failures = 0
                connected()
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True,
                                                       timeout=None)
                    if message is not None and message.get("type") == "message":
                        data = message["data"]
                        notice(data.decode("utf-8", "replace") if isinstance(data, bytes)
                               else str(data))
            except (redis.exceptions.RedisError, OSError) as exc:
                logger.warning("flowmem: the Redis subscription dropped (%s); "
                               "reconnecting", exc)
            finally:
                lost()
                with suppress(redis.exceptions.RedisError, OSError, AttributeError):
                    await pubsub.aclose()
            await asyncio.sleep(_BACKOFF[min(failures, len(_BACKOFF) - 1)])
            failures += 1
