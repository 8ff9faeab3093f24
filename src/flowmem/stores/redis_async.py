"""The asyncio Redis store, where it was first importable from."""

from __future__ import annotations

from .redis import AsyncRedisStore

__all__ = ["AsyncRedisStore"]
