"""The client's deadline of a PostgreSQL operation: a frozen server cannot stall a caller.

The server bounds its own work (``statement_timeout``, ``lock_timeout``) and
TCP bounds a dead peer (keepalives, ``tcp_user_timeout``), but a server that
is stopped (``SIGSTOP``) or hung while its kernel still acknowledges TCP
sends nothing and trips none of them. So every operation arms a deadline on
its connection (:func:`arm`) and disarms it when done (:func:`disarm`). One
daemon thread per process looks at the armed deadlines every
:data:`TICK` seconds and, past one, shuts the connection's socket down: the
blocked read (blocking face) or the event loop's reader (asyncio face) sees
end-of-file at once, psycopg marks the connection broken, the pool discards
it and the store raises :class:`~flowmem.errors.StoreUnavailable`. No cancel
request is sent (it would itself wait on the frozen server).

The socket is shut down through a duplicate of its descriptor taken when the
deadline is armed, so the watchdog never touches psycopg's connection object
and never a descriptor number that may have been reused; :func:`disarm`
closes the duplicate only once the watchdog is done with it. Cost on the hot
path: a ``dup``, a ``close`` and two dict operations (a few µs).
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from typing import Any, Final

__all__ = ["TICK", "Deadline", "arm", "disarm"]

TICK: Final = 0.1
"""Seconds between two looks of the watchdog (how late past its deadline a cut may come)."""


class Deadline:
    """One armed deadline: ``fired`` tells whether the watchdog cut the connection."""

    __slots__ = ("at", "fd", "fired", "seconds", "serial")

    def __init__(self, serial: int, fd: int, seconds: float) -> None:
        self.serial = serial
        self.fd = fd
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self.fired = False


class _Watchdog:
    """The process's armed deadlines and the thread that keeps them."""

    def __init__(self) -> None:
        self.armed: dict[int, Deadline] = {}
        self.serials = itertools.count()
        self.cutting = threading.Lock()  # held while a socket is being shut down
        self.starting = threading.Lock()
        self.started = False

    def start(self) -> None:
        with self.starting:
            if not self.started:
                threading.Thread(target=self.watch, name="flowmem-postgres-watchdog",
                                 daemon=True).start()
                self.started = True

    def watch(self) -> None:
        while True:
            time.sleep(TICK)
            now = time.monotonic()
            try:
                due = [d for d in self.armed.copy().values() if d.at <= now]
            except RuntimeError:  # resized while copied: look again next tick
                continue
            for deadline in due:
                self.cut(deadline)

    def cut(self, deadline: Deadline) -> None:
        with self.cutting:
            if self.armed.pop(deadline.serial, None) is None:
                return  # disarmed meanwhile: the operation finished in time
            deadline.fired = True
            try:
                sock = socket.socket(fileno=deadline.fd)
            except OSError:
                return
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already shut down or reset by the peer
            finally:
                sock.detach()  # the descriptor is disarm()'s to close


_WATCHDOG = _Watchdog()


def _forked() -> None:
    global _WATCHDOG
    _WATCHDOG = _Watchdog()  # the parent's thread and deadlines are not the child's


os.register_at_fork(after_in_child=_forked)


def arm(conn: Any, seconds: float) -> Deadline | None:
    """Cut ``conn``'s socket if it is still armed ``seconds`` from now (``0``: never).

    ``conn`` is a psycopg connection, blocking or asyncio.
    """
    if seconds <= 0:
        return None
    watchdog = _WATCHDOG
    deadline = Deadline(next(watchdog.serials), os.dup(conn.pgconn.socket), seconds)
    watchdog.armed[deadline.serial] = deadline
    if not watchdog.started:
        watchdog.start()
    return deadline


def disarm(deadline: Deadline | None) -> None:
    """Stop watching; afterwards ``deadline.fired`` is final."""
    if deadline is None:
        return
    watchdog = _WATCHDOG
    if watchdog.armed.pop(deadline.serial, None) is None:
        with watchdog.cutting:
            pass  # the watchdog took it: wait until it is done with the descriptor
    os.close(deadline.fd)
