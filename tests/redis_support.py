"""Helpers for the Redis tests: URLs, key clean-up, a cuttable TCP proxy.

The writers and the audit of the contention tests are every backend's:
``contention.py``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import uuid
from typing import Any
from urllib.parse import urlsplit

from backends import REDIS_URL


def session_prefix() -> str:
    """A key prefix no other test session uses."""
    return f"fmtest-{uuid.uuid4().hex[:12]}"


def url_with(prefix: str, base: str = REDIS_URL, **options: Any) -> str:
    query = "&".join([f"prefix={prefix}", *(f"{k}={v}" for k, v in options.items())])
    return f"{base}{'&' if '?' in base else '?'}{query}"


def raw_client(base: str = REDIS_URL) -> Any:
    import redis

    return redis.Redis.from_url(base)


def drop_prefix(prefix: str, base: str = REDIS_URL) -> int:
    """Delete every key a store with ``prefix`` may have written; how many."""
    client = raw_client(base)
    removed = 0
    try:
        for pattern in ("{" + prefix + ":*", prefix + ":idx:*"):
            batch = list(client.scan_iter(match=pattern, count=1000))
            for start in range(0, len(batch), 500):
                removed += client.delete(*batch[start:start + 500])
    finally:
        client.close()
    return removed


class CuttableProxy:
    """A TCP proxy in front of Redis that a test can cut (every connection, and the port)."""

    def __init__(self, base: str = REDIS_URL) -> None:
        parts = urlsplit(base)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 6379)
        self.db = parts.path or "/0"
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.cut_done = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}{self.db}"

    def _accept(self) -> None:
        while not self.cut_done.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            if self.cut_done.is_set():
                client.close()
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Drop every proxied connection and stop listening (reconnects are refused)."""
        self.cut_done.set()
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self.server.close()
        for s in self.sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


class CountingProxy:
    """A TCP proxy in front of Redis that counts round trips, the honest way.

    A round trip is a burst of bytes from a client connection that follows a
    reply on that connection (or opens it): however many commands a pipeline
    or a ``MULTI`` carries, it is one burst; every wait for a reply before the
    next send is one more. Counted over every connection the client opens.
    """

    def __init__(self, base: str = REDIS_URL) -> None:
        parts = urlsplit(base)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 6379)
        self.db = parts.path or "/0"
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self._mutex = threading.Lock()
        self._bursts = 0
        self._replied: dict[int, bool] = {}  # per connection: a reply came since its last send
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}{self.db}"

    @property
    def round_trips(self) -> int:
        with self._mutex:
            return self._bursts

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self._mutex:
                self._sockets += [client, upstream]
                self._replied[id(client)] = True
            for a, b, outbound in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pump, args=(a, b, id(client), outbound),
                                 daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, conn: int, outbound: bool) -> None:
        try:
            while data := src.recv(1 << 20):
                with self._mutex:  # counted before forwarding: the reply cannot overtake it
                    if outbound and self._replied[conn]:
                        self._bursts += 1
                    self._replied[conn] = not outbound
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()
