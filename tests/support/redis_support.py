"""Helpers for the Redis tests: URLs, key clean-up, a cuttable TCP proxy.

The writers and the audit of the contention tests are every backend's:
``contention.py``.
"""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import urlsplit

from backends import REDIS_URL
from flowmem.messages import Message, canonical_messages
from round_trip_proxy import CountingProxy as RoundTripProxy
from tcp_proxy import Proxy, through


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


class CuttableProxy(Proxy):
    """A TCP proxy in front of Redis (``base``'s host, port and database) that a test can
    cut: :meth:`cut` drops every connection and the port (reconnects are refused)."""

    def __init__(self, base: str = REDIS_URL) -> None:
        parts = urlsplit(base)
        super().__init__(parts.hostname or "127.0.0.1", parts.port or 6379)
        self.url = through(self, base)

    def cut(self) -> None:
        self.close()


class CountingProxy(RoundTripProxy):
    """:class:`round_trip_proxy.CountingProxy` in front of Redis (``base``'s host, port
    and database): a round trip is a burst of bytes from a client connection that
    follows a reply on it (or opens it) — however many commands a pipeline or a
    ``MULTI`` carries, one burst; every wait for a reply before the next send, one
    more. Counted over every connection the client opens."""

    def __init__(self, base: str = REDIS_URL) -> None:
        parts = urlsplit(base)
        super().__init__(parts.hostname or "127.0.0.1", parts.port or 6379)
        self.url = through(self, base)


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
