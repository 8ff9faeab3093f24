"""``sqlite:///path.db`` — the embedded default store, blocking and asyncio.

See :class:`SQLiteStore` (the blocking face) and :class:`AsyncSQLiteStore`
(one connection thread per store, with group commit).
"""

from __future__ import annotations

from ._aio import AsyncSQLiteStore
from ._store import SQLiteStore

__all__ = ["AsyncSQLiteStore", "SQLiteStore"]
