"""Published holds: an SQLite append learns that nobody holds its key without locking it.

An SQLite append is one ``BEGIN IMMEDIATE`` transaction, so the database's
write lock already serializes it with every other append of every thread and
process (MEM-12). The key lock (:mod:`._locks`) matters on top of that only to
an explicit holder (:meth:`Store.lock <flowmem.store.Store.lock>`), whose
read-modify-write spans several transactions: an append to its key must wait
for it. Taking the key lock for every append cost two ``fcntl`` calls and the
Python around them (#14). Instead a holder *publishes* its hold, one byte per
stripe of the lock file, which every process maps in memory:

- a holder takes the stripe's lock (the thread lock and the byte-range lock,
  as before), then sets the stripe's byte while it holds the database's write
  lock (an empty ``BEGIN IMMEDIATE`` transaction), and clears the byte before it
  lets go of the stripe;
- an append reads the byte inside its own ``BEGIN IMMEDIATE`` transaction.
  Clear: nobody holds the key, and nobody can begin to before the append
  commits (publishing needs the write lock the append holds), so it runs.
  Set: it leaves the transaction without writing and takes the key lock as
  before, with its bounded wait (:meth:`SQLiteStore.append
  <flowmem.stores.sqlite.SQLiteStore.append>`).
- A holder killed while holding leaves its byte set, and the kernel drops its
  byte-range lock. The next append that takes the stripe's lock clears the
  byte: a byte is set only by a holder of that lock, so whoever holds it knows
  that no hold is live.

Two keys that share a stripe share its byte, as they share its lock. flowmem
only ever grows the lock file; truncating it under a running process would
fault the mapping.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from ..errors import StoreBusy

__all__ = ["Holds", "map_holds", "published"]


class Holds:
    """The published holds of one lock file, mapped in memory."""

    __slots__ = ("_bytes",)

    def __init__(self, mapped: mmap.mmap) -> None:
        self._bytes = mapped

    def held(self, stripe: int) -> bool:
        """Whether a hold of ``stripe`` is published (read inside a write transaction)."""
        return self._bytes[stripe] != 0

    def publish(self, stripe: int) -> None:
        """Publish a hold of ``stripe`` (by its holder, under the database's write lock)."""
        self._bytes[stripe] = 1

    def withdraw(self, stripe: int) -> None:
        """Withdraw the hold of ``stripe`` (by whoever holds the stripe's lock)."""
        self._bytes[stripe] = 0


def map_holds(fd: int, stripes: int) -> Holds | None:
    """The holds of the lock file open as ``fd`` (grown to one byte per stripe if
    smaller), or ``None`` where it cannot be mapped: appends then take the key lock."""
    try:
        if os.fstat(fd).st_size < stripes:
            os.ftruncate(fd, stripes)  # every process grows it to the same size
        return Holds(mmap.mmap(fd, stripes))
    except (OSError, ValueError):
        return None


@contextmanager
def published(hold: AbstractContextManager[bool], holds: Holds, stripe: int,
              under_write_lock: Callable[[Callable[[], None]], object]) -> Iterator[bool]:
    """An explicit holder's lock: ``hold`` (the stripe's key lock), its hold published
    while held. ``under_write_lock`` runs a function inside an empty write transaction
    (bounded by the store's ``busy_timeout``: past it the hold is not had)."""
    with hold as had:
        if had:
            try:
                under_write_lock(lambda: holds.publish(stripe))
            except StoreBusy:
                had = False
        try:
            yield had
        finally:
            if had:
                holds.withdraw(stripe)
