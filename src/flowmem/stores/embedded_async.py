"""The embedded asyncio stores, where they were first importable from."""

from __future__ import annotations

from .memory import AsyncInMemoryStore
from .sqlite import AsyncSQLiteStore

__all__ = ["AsyncInMemoryStore", "AsyncSQLiteStore"]
