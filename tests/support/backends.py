"""Every backend the suite runs against, and how to reach it.

PostgreSQL and Redis are used when reachable (``FLOWMEM_TEST_POSTGRES``,
default ``postgresql://127.0.0.1:5432/test``; ``FLOWMEM_TEST_REDIS``, default
``redis://127.0.0.1:6379/15``); otherwise their tests skip with the reason.
A server that is reachable but refuses the login (wrong user, password or
database) skips too, with the server's own message. ``.ci/run`` starts both,
so in CI they always run. Each test session writes
under its own PostgreSQL schema and Redis key prefix, removed at the end
(conftest.py), so runs never pile up data on a long-lived server.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from flowmem.store import Store
from flowmem.stores import open_store

POSTGRES_URL = os.environ.get("FLOWMEM_TEST_POSTGRES", "postgresql://127.0.0.1:5432/test")
REDIS_URL = os.environ.get("FLOWMEM_TEST_REDIS", "redis://127.0.0.1:6379/15")
SESSION_TAG = f"fmtest_{os.getpid()}_{uuid.uuid4().hex[:8]}"
"""This test session's PostgreSQL schema and Redis key prefix."""


def with_option(url: str, name: str, value: str) -> str:
    """``url`` with one query option added."""
    return f"{url}{'&' if '?' in url else '?'}{name}={value}"


@dataclass
class Backend:
    name: str
    url: str
    persistent: bool

    def open(self) -> Store:
        return open_store(self.url)


def _reachable(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1",
                                       parts.port or default_port), timeout=1):
            return True
    except OSError:
        return False


def shown(url: str) -> str:
    """``url`` fit for a skip reason: any password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


@functools.cache
def _postgres_login_refused(url: str) -> str | None:
    """The server's reason when it answers but refuses to let us in, else ``None``."""
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        text = str(exc).strip().replace(str(urlsplit(url).password), "***")
        first = text.splitlines()[0] if text else type(exc).__name__
        return (f"PostgreSQL at {shown(url)} is reachable but refused the connection ({first}); "
                "set FLOWMEM_TEST_POSTGRES to a URL whose user may log in and create a schema")
    return None


def unavailable(name: str) -> str | None:
    """Why a backend cannot run here, or ``None`` when it can."""
    if name == "postgres":
        if importlib.util.find_spec("flowmem.stores.postgres") is None:
            return "flowmem.stores.postgres is not built yet"
        if importlib.util.find_spec("psycopg") is None:
            return "psycopg is not installed (pip install -e '.[postgres]')"
        if not _reachable(POSTGRES_URL, 5432):
            return f"PostgreSQL is not reachable at {POSTGRES_URL}"
        return _postgres_login_refused(POSTGRES_URL)
    if name == "redis":
        if importlib.util.find_spec("flowmem.stores.redis") is None:
            return "flowmem.stores.redis is not built yet"
        if importlib.util.find_spec("redis") is None:
            return "redis-py is not installed (pip install -e '.[redis]')"
        if not _reachable(REDIS_URL, 6379):
            return f"Redis is not reachable at {REDIS_URL}"
    return None


BACKENDS = ("memory", "sqlite", "postgres", "redis")


def make_backend(name: str, tmp_path: Path) -> Backend:
    if name == "memory":
        return Backend(name, "memory://", persistent=False)
    if name == "sqlite":
        return Backend(name, f"sqlite:///{tmp_path / 'flowmem.db'}", persistent=True)
    if name == "postgres":
        return Backend(name, with_option(POSTGRES_URL, "schema", SESSION_TAG), persistent=True)
    return Backend(name, with_option(REDIS_URL, "prefix", SESSION_TAG), persistent=True)


Opener = Callable[[], Store]
