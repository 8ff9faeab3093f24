"""The files of one SQLite database: creation owner-only, identity, read-only access.

A database is the main file plus, while any connection has it open in WAL
mode, ``<name>-wal`` and ``<name>-shm`` (and flowmem's ``<name>.lock``).

* **Owner-only files.** A database flowmem creates is created ``0600``
  whatever the umask; SQLite gives ``-wal`` and ``-shm`` the main file's
  mode, so they are ``0600`` too. Existing files keep their modes: flowmem
  never changes the permissions of a file it did not create.
* **Identity.** ``(st_dev, st_ino)`` of the path. An open connection keeps
  its file alive after ``rm`` (and its inode number cannot be reused while
  it is open), so a path whose identity changed names another file: the
  database was deleted or replaced under the store.
* **Read-only access** without side effects: a file this process cannot
  write, with no ``-wal``/``-shm`` beside it (no connection has it open), is
  opened ``immutable`` — SQLite would otherwise create ``-wal``/``-shm``
  with the read-only mode of the main file and leave them behind, and a
  writer could not use the database again until they were deleted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final
from urllib.parse import quote

from ...errors import StoreError, StoreUnavailable

__all__ = ["OWNER_ONLY", "DatabaseFiles", "FileIdentity"]

OWNER_ONLY: Final = 0o600
_IDENTITY_AT: Final = (1 << 16) + 64
"""Where the lock file records the identity of the main file its stores opened: past the
stripes' bytes and the setup lock's (:mod:`flowmem.stores._locks`), which nothing maps."""

FileIdentity = tuple[int, int]
"""``(st_dev, st_ino)`` of a file."""


@dataclass(frozen=True)
class DatabaseFiles:
    """The paths of one database and what can be done with them."""

    path: str

    @property
    def wal(self) -> str:
        return self.path + "-wal"

    @property
    def shm(self) -> str:
        return self.path + "-shm"

    @property
    def lock(self) -> str:
        return self.path + ".lock"

    def identity(self) -> FileIdentity | None:
        """The identity of the file the path names now, ``None`` when there is none."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    def names(self, identity: FileIdentity | None) -> bool:
        """Whether the path names the file of ``identity`` now (one ``stat``; the check
        after every transaction)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        return identity is not None and st.st_ino == identity[1] and st.st_dev == identity[0]

    def exists(self) -> bool:
        return os.path.exists(self.path)

    def live_files(self) -> bool:
        """Whether a ``-wal`` or ``-shm`` exists (a connection has, or had, it open)."""
        return os.path.exists(self.wal) or os.path.exists(self.shm)

    def old_file_holders(self) -> list[int]:
        """The processes whose SQLite connections hold this path's ``-shm`` open while they
        have ANOTHER main file open under the path's name (it was replaced under them):
        their ``-wal``/``-shm`` belong to the old file, and a connection to the new one
        would share them and corrupt it. Linux (``/proc``); elsewhere an empty list."""
        try:
            shm = os.stat(self.shm)
            current = os.stat(self.path)
            with open("/proc/locks", encoding="ascii", errors="replace") as table:
                locks = table.read().splitlines()
        except OSError:
            return []
        pids: set[int] = set()
        for line in locks:  # "1: POSIX ADVISORY READ <pid> <maj>:<min>:<inode> <start> <end>"
            fields = line.split()
            if "->" in fields or len(fields) < 8:
                continue
            inode = fields[5].rsplit(":", 1)[-1]
            if inode == str(shm.st_ino) and fields[4].isdigit():
                pids.add(int(fields[4]))
        real = os.path.realpath(self.path)
        holders = []
        for pid in sorted(pids):
            try:
                descriptors = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            old = new = False  # a process with the current file open uses the -shm for it
            for fd in descriptors:
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target not in (real, real + " (deleted)"):
                        continue
                    st = os.stat(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) == (current.st_dev, current.st_ino):
                    new = True
                else:
                    old = True
            if old and not new:
                holders.append(pid)
        return holders

    def recorded_identity(self) -> FileIdentity | None:
        """The identity of the main file the last store opened here (the lock file's
        record), ``None`` when none was recorded."""
        try:
            with open(self.lock, "rb") as file:
                file.seek(_IDENTITY_AT)
                raw = file.read(16)
        except OSError:
            return None
        if len(raw) < 16 or not any(raw):
            return None
        return int.from_bytes(raw[:8], "big"), int.from_bytes(raw[8:], "big")

    def record_identity(self, identity: FileIdentity | None) -> None:
        """Record in the lock file which main file the stores here have open."""
        if identity is None:
            return
        try:
            fd = os.open(self.lock, os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            os.pwrite(fd, identity[0].to_bytes(8, "big") + identity[1].to_bytes(8, "big"),
                      _IDENTITY_AT)
        except OSError:
            pass
        finally:
            os.close(fd)

    def refuse_old_files(self) -> None:
        """Raise :class:`StoreUnavailable` when this path's ``-wal``/``-shm`` belong to
        another main file than the one the path names now (it was replaced): while live
        connections of the old file use them (:meth:`old_file_holders`), or when the lock
        file recorded another file (its writers are gone, their WAL left behind)."""
        if not self.live_files():
            return
        recorded, current = self.recorded_identity(), self.identity()
        if recorded is not None and current is not None and recorded != current \
                and not self.old_file_holders():
            raise StoreUnavailable(
                f"{self.path} was replaced, but the -wal and -shm beside it belong to the old "
                f"file (whose writers are gone): opening them with the new file would replay "
                f"the old file's WAL into it. Delete {self.wal} and {self.shm}, then open it "
                f"again")
        holders = self.old_file_holders()
        if holders:
            raise StoreUnavailable(
                f"{self.path} was replaced while {len(holders)} process(es) "
                f"({', '.join(map(str, holders[:5]))}) still have the old file open: its "
                f"-wal and -shm belong to the old file, and opening the new one beside them "
                f"would corrupt it. Stop those processes (their stores fail from the "
                f"replacement on), then open it again")

    def unwritable(self) -> bool:
        """An existing database this process cannot write (opened read-only automatically).

        Either the main file is not writable, or its directory is not and no
        ``-wal`` exists to write into (SQLite could not create one).
        """
        if not self.exists():
            return False
        if not os.access(self.path, os.W_OK):
            return True
        directory = os.path.dirname(self.path)
        return not os.access(directory, os.W_OK | os.X_OK) and not os.path.exists(self.wal)

    def create(self) -> bool:
        """Create an empty main file ``0600`` (umask-independent); whether this call made it.

        Refuses when the main file is missing but a ``-wal``/``-shm`` is
        there: those are the leftovers of a deleted database (perhaps still
        open in another process), and SQLite would replay the old WAL into
        the new file.
        """
        if self.exists():
            return False
        if self.live_files():
            raise StoreUnavailable(
                f"{self.path} does not exist but its -wal/-shm do: the database was deleted "
                f"while open (its writers fail from then on). Restore the file, or delete "
                f"{self.wal} and {self.shm} to start a new database")
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                         OWNER_ONLY)
        except FileExistsError:
            return False
        except OSError as exc:
            raise StoreError(f"cannot create {self.path}: {exc}") from exc
        try:
            if hasattr(os, "fchmod"):  # POSIX: the umask may have taken bits away
                os.fchmod(fd, OWNER_ONLY)
        finally:
            # closing a descriptor drops the process's POSIX locks on the file, but
            # this file is new: no connection can hold one on it yet
            os.close(fd)
        return True

    def uri(self, *, read_only: bool) -> str:
        """The SQLite URI: ``mode=rw`` (never creates), ``mode=ro`` or ``immutable=1``."""
        base = "file:" + quote(self.path, safe="/")
        if not read_only:
            return base + "?mode=rw"
        if self.unwritable() and not self.live_files():
            return base + "?immutable=1"
        return base + "?mode=ro"
