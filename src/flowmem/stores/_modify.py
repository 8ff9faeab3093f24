"""A read-modify-write of one value in ONE atomic unit of the store.

The service updates its own records (a session's status, a token's last use,
a revoke) by reading a value, changing it and writing it back. Done as a
store lock held around a read and a write, that needs two connections of a
pooled store at once (the lock's transaction, then the read's and the write's),
and behind a transaction pooler with a small server pool every holder can end up
waiting for a connection that only another holder can free. A store that
offers ``modify(key, change, timeout)`` does the whole of it in one transaction
on one connection instead (PostgreSQL: the value's row locked ``FOR UPDATE``);
:func:`flowmem.service._records.modify` falls back to lock + read + write for
the others.

``change(found, value)`` is called with what the key holds and returns the
new value, :data:`KEEP` (leave it) or :data:`DELETE` (remove it). It may be
called more than once (a transaction run again) and must not block. Only
values are seen, never a conversation's messages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

__all__ = ["DELETE", "KEEP", "Change", "Verdict"]


class Verdict:
    """What a :data:`Change` answers besides a new value."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


KEEP: Final = Verdict("keep")
DELETE: Final = Verdict("delete")

Change = Callable[[bool, Any], Any]
"""``change(found, value)`` → the new value, :data:`KEEP` or :data:`DELETE`."""
