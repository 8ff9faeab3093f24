"""Storage backends and the URL that picks one.

==============================  ==========================================
URL                             backend
==============================  ==========================================
``memory://``                   :class:`~flowmem.stores.memory.InMemoryStore`
``sqlite:///relative/path.db``  :class:`~flowmem.stores.sqlite.SQLiteStore`
``sqlite:////absolute/path.db``
``postgresql://user@host/db``   PostgreSQL (``pip install 'flowmem[postgres]'``)
``redis://host:6379/0``         Redis (``pip install 'flowmem[redis]'``)
==============================  ==========================================
"""

from __future__ import annotations

import os
from typing import Final

from ..errors import InvalidStoreURL
from ..store import AsyncStore, Store

__all__ = ["DEFAULT_URL", "open_async_store", "open_store"]

DEFAULT_URL: Final = "sqlite:///flowmem.db"


def _scheme(url: str | None) -> tuple[str, str]:
    """``(scheme, url)`` of a store URL (``None``: ``$FLOWMEM_STORE`` or the default)."""
    if url is None:
        url = os.environ.get("FLOWMEM_STORE") or DEFAULT_URL
    if not isinstance(url, str) or "://" not in url:
        raise InvalidStoreURL(f"not a store URL: {url!r} (expected e.g. {DEFAULT_URL})")
    scheme = url.split("://", 1)[0].lower()
    if scheme == "postgres":
        scheme = "postgresql"
    if scheme == "rediss":
        scheme = "redis"
    if scheme not in ("memory", "sqlite", "postgresql", "redis"):
        raise InvalidStoreURL(
            f"unknown store scheme {scheme!r} in {url!r}; "
            "expected memory://, sqlite:///, postgresql:// or redis://"
        )
    return scheme, url


def open_store(url: str | None = None) -> Store:
    """Open the backend a store URL names, for :class:`~flowmem.Memory`.

    With no URL: ``$FLOWMEM_STORE``, else ``sqlite:///flowmem.db`` in the
    working directory. Raises :class:`~flowmem.errors.InvalidStoreURL` for
    an unknown scheme and :class:`~flowmem.errors.MissingDependency` when the
    backend's extra is not installed.
    """
    scheme, url = _scheme(url)
    if scheme == "memory":
        from .memory import InMemoryStore

        return InMemoryStore()
    if scheme == "sqlite":
        from .sqlite import SQLiteStore

        return SQLiteStore.from_url(url)
    if scheme == "postgresql":
        from .postgres import PostgresStore

        if "replica=" in url:
            raise InvalidStoreURL("replica= (read replicas) is for the asyncio face: "
                                  "flowmem serve or AsyncMemory")
        return PostgresStore.from_url(url)
    from .redis import RedisStore

    return RedisStore.from_url(url)


def open_async_store(url: str | None = None) -> AsyncStore:
    """Open the backend a store URL names, for :class:`~flowmem.AsyncMemory`.

    The same URLs, defaults and errors as :func:`open_store`. Needs no running
    event loop: network backends connect on first use.
    """
    scheme, url = _scheme(url)
    if scheme == "memory":
        from .memory import AsyncInMemoryStore

        return AsyncInMemoryStore()
    if scheme == "sqlite":
        from .sqlite import AsyncSQLiteStore

        return AsyncSQLiteStore.from_url(url)
    if scheme == "postgresql":
        from .postgres import AsyncPostgresStore

        if "replica=" in url:  # read replicas with read-your-writes
            from .postgres._replicas import AsyncReplicaRouted

            return AsyncReplicaRouted.from_url(url)
        return AsyncPostgresStore.from_url(url)
    from .redis import AsyncRedisStore

    return AsyncRedisStore.from_url(url)
