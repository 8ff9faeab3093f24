"""The client's deadline of a PostgreSQL operation: a frozen server cannot stall a caller.

The server bounds its own work (``statement_timeout``, ``lock_timeout``) and
TCP bounds a dead peer (keepalives, ``tcp_user_timeout``), but a server that
is stopped (``SIGSTOP``) or hung while its kernel still acknowledges TCP
sends nothing and trips none of them. So every operation arms a deadline on
its connection (:func:`arm`) and disarms it when done (:func:`disarm`). One
daemon thread per process sleeps until the earliest armed deadline (or, with
none armed, until one is) and, past it, shuts the connection's socket down: the
blocked read (blocking face) or the event loop's reader (asyncio face) sees
end-of-file at once, psycopg marks the connection broken, the pool discards
it and the store raises :class:`~flowmem.errors.StoreUnavailable`. No cancel
request is sent (it would itself wait on the frozen server).

The socket is shut down through a duplicate of its descriptor taken when the
deadline is armed, so the watchdog never touches psycopg's connection object
and never a descriptor number that may have been reused; :func:`disarm`
closes the duplicate only once the watchdog is done with it. Cost on the hot
path: a ``dup``, a ``close``, an uncontended lock and two dict operations (a few
µs). An idle process's watchdog never wakes; a busy one wakes about once per
deadline length, since an operation almost always disarms long before its
deadline.
"""

from __future__ import annotations

import itertools
import math
import os
import socket
import threading
import time
from typing import Any

__all__ = ["Deadline", "arm", "disarm"]


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
        self.changed = threading.Condition(threading.Lock())
        self.wake_at = math.inf  # when the thread next looks (guarded by ``changed``)
        self.started = False

    def add(self, deadline: Deadline) -> None:
        with self.changed:
            self.armed[deadline.serial] = deadline
            if not self.started:
                threading.Thread(target=self.watch, name="flowmem-postgres-watchdog",
                                 daemon=True).start()
                self.started = True
            elif deadline.at < self.wake_at:
                self.changed.notify()

    def watch(self) -> None:
        while True:
            with self.changed:
                now = time.monotonic()
                due = [d for d in self.armed.values() if d.at <= now]
                if not due:
                    self.wake_at = min((d.at for d in self.armed.values()), default=math.inf)
                    self.changed.wait(None if self.wake_at == math.inf else self.wake_at - now)
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
    watchdog.add(deadline)
    return deadline


def disarm(deadline: Deadline | None) -> None:
    """Stop watching; afterwards ``deadline.fired`` is final."""
    if deadline is None:
        return
    watchdog = _WATCHDOG
    with watchdog.changed:  # the thread reads ``armed`` under it
        taken = watchdog.armed.pop(deadline.serial, None) is None
    if taken:
        with watchdog.cutting:
            pass  # the watchdog took it: wait until it is done with the descriptor
    os.close(deadline.fd)
