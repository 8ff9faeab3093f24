"""The asyncio PostgreSQL store, where it was first importable from."""

from __future__ import annotations

from .postgres import AsyncPostgresStore

__all__ = ["AsyncPostgresStore"]
