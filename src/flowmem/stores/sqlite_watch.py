"""Telling cheaply that a path may no longer name the database file a store has open.

After every transaction the SQLite store checks that its path still names the file
its connections have open (:mod:`.sqlite_files`, identity): a commit into a deleted
or replaced file must never be acknowledged. A ``stat`` costs about 6,000
instructions, 3.6 % of an append. On Linux a :class:`PathWatch` asks the kernel
instead: one inotify instance watches the file (its link count changing,
``IN_ATTRIB``: unlinked, or renamed over; moved; deleted) and every directory above
it (moved or deleted). A ``poll`` with no timeout costs about 830 instructions and
tells whether any such event ever happened.

Events are never read: after the first one (a real deletion, or only a ``chmod``)
the descriptor stays readable, and every later check stats the path, as without a
watch. So an empty poll means nothing unlinked, moved or renamed the file or a
directory above it since the watch began, and the path still names the file; no
thread can consume another's evidence.

Not watched, so checked by ``stat`` every time: a path through a symbolic link (a
link can be pointed elsewhere without touching the file or its directories), a
system without inotify, and a process out of inotify instances or watches. Not seen
by the watch: a file system mounted over a directory above the file while it is
open (a ``stat`` would see it; SQLite's WAL mode needs a local file system).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import sys
import weakref
from collections.abc import Callable
from functools import cache
from typing import Final

__all__ = ["Events", "PathWatch"]

Events = Callable[[int], list[tuple[int, int]]]
"""A thread's ``poll`` of the watch: called with ``0``, an empty list when nothing
happened."""

_IN_ATTRIB: Final = 0x004
_IN_DELETE_SELF: Final = 0x400
_IN_MOVE_SELF: Final = 0x800
_FILE_EVENTS: Final = _IN_ATTRIB | _IN_DELETE_SELF | _IN_MOVE_SELF
_DIRECTORY_EVENTS: Final = _IN_DELETE_SELF | _IN_MOVE_SELF


class PathWatch:
    """An inotify instance watching one file and the directories above it."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        # a store dropped without close() gives its descriptor back (an instance is one
        # of the user's inotify instances, 128 by default)
        self._closer = weakref.finalize(self, os.close, fd)

    @classmethod
    def start(cls, path: str) -> PathWatch | None:
        """A watch of ``path``, or ``None`` where one cannot tell (see the module notes):
        then the caller stats the path."""
        absolute = os.path.abspath(path)
        libc = _libc()
        if libc is None or os.path.realpath(absolute) != absolute:
            return None
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            return None
        watch = cls(fd)
        for target, mask in [(absolute, _FILE_EVENTS),
                             *((folder, _DIRECTORY_EVENTS) for folder in _above(absolute))]:
            if libc.inotify_add_watch(fd, os.fsencode(target), mask) < 0:
                watch.close()
                return None
        return watch

    def events(self) -> Events:
        """A ``poll`` of the watch for the calling thread (a poll object refuses
        concurrent calls, so each thread has its own)."""
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        return poller.poll

    def close(self) -> None:
        """Stop watching (the store's connections, and their polls, are gone)."""
        self._fd = -1
        self._closer()  # once: a second call does nothing


def _above(path: str) -> list[str]:
    """The directories above ``path``, nearest first, the root included."""
    folders: list[str] = []
    folder = os.path.dirname(path)
    while True:
        folders.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            return folders
        folder = parent


@cache
def _libc() -> ctypes.CDLL | None:
    """The C library, where it has inotify."""
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    except (OSError, AttributeError):
        return None
    return libc
