"""``redis://host:6379/0`` — the Redis store, blocking and asyncio.

Needs ``pip install 'flowmem[redis]'``. :class:`RedisStore` is the blocking
face, :class:`AsyncRedisStore` the asyncio one; both run the same sans-I/O
programs and Lua scripts.
"""

from __future__ import annotations

from ._aio import AsyncRedisStore
from ._store import RedisStore

__all__ = ["AsyncRedisStore", "RedisStore"]
