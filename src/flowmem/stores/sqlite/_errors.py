"""SQLite's driver errors mapped to flowmem's, at the store's boundary (one place)."""

from __future__ import annotations

import os
import sqlite3
from typing import Final

from ...errors import StoreBusy, StoreError, StoreReadOnly

__all__ = ["is_busy", "mapped_error"]

_SQLITE_BUSY: Final = 5
_SQLITE_LOCKED: Final = 6
_SQLITE_READONLY: Final = 8


def _primary_code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else int(code) & 0xFF


def is_busy(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` says the database was locked by another connection."""
    code = _primary_code(exc)
    if code is not None:
        return code in (_SQLITE_BUSY, _SQLITE_LOCKED)
    return "locked" in str(exc)


def mapped_error(exc: sqlite3.Error, path: str) -> StoreError:
    """The flowmem error for a driver error on the database at ``path``."""
    text = str(exc)
    if isinstance(exc, sqlite3.OperationalError) and is_busy(exc):
        return StoreBusy(f"SQLite database {path} stayed locked: {text}")
    if _primary_code(exc) == _SQLITE_READONLY:
        shm = path + "-shm"
        hint = (f" ({shm} is not writable, perhaps left by a read-only open: delete it "
                f"while no process has the database open)"
                if os.path.exists(shm) and not os.access(shm, os.W_OK) else "")
        return StoreReadOnly(f"SQLite database {path} cannot be written: {text}{hint}")
    return StoreError(f"SQLite error on {path}: {text}")
