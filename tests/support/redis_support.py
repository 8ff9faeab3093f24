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
from flowmem.messages import Message, canonical_messages
from round_trip_proxy import CountingProxy as RoundTripProxy


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
        for pattern in ("{" + prefix + ":*", prefix + ":idem:*"):
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


class CountingProxy(RoundTripProxy):
    """:class:`round_trip_proxy.CountingProxy` in front of Redis (``base``'s host, port
    and database): a round trip is a burst of bytes from a client connection that
    follows a reply on it (or opens it) — however many commands a pipeline or a
    ``MULTI`` carries, one burst; every wait for a reply before the next send, one
    more. Counted over every connection the client opens."""

    def __init__(self, base: str = REDIS_URL) -> None:
        parts = urlsplit(base)
        super().__init__(parts.hostname or "127.0.0.1", parts.port or 6379)
        self.db = parts.path or "/0"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}{self.db}"


# -- messages the Redis tests append ------------------------------------------------
def msgs(*raw: dict[str, Any]) -> list[Message]:
    return canonical_messages(list(raw))


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def turn(*ids: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": i, "type": "function"} for i in ids]}


def result(call: str, text: str = "ok") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call, "content": text}
