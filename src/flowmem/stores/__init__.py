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
from ..store import Store

__all__ = ["DEFAULT_URL", "open_store"]

DEFAULT_URL: Final = "sqlite:///flowmem.db"


def open_store(url: str | None = None) -> Store:
    """Open the backend a store URL names.

    With no URL: ``$FLOWMEM_STORE``, else ``sqlite:///flowmem.db`` in the
    working directory. Raises :class:`~flowmem.errors.InvalidStoreURL` for
    an unknown scheme and :class:`~flowmem.errors.MissingDependency` when the
    backend's extra is not installed.
    """
    if url is None:
        url = os.environ.get("FLOWMEM_STORE") or DEFAULT_URL
    if not isinstance(url, str) or "://" not in url:
        raise InvalidStoreURL(f"not a store URL: {url!r} (expected e.g. {DEFAULT_URL})")
    scheme = url.split("://", 1)[0].lower()
    if scheme == "memory":
        from .memory import InMemoryStore

        return InMemoryStore()
    if scheme == "sqlite":
        from .sqlite import SQLiteStore

        return SQLiteStore.from_url(url)
    if scheme in ("postgresql", "postgres"):
        from .postgres import PostgresStore

        return PostgresStore.from_url(url)
    if scheme in ("redis", "rediss"):
        from .redis import RedisStore

        return RedisStore.from_url(url)
    raise InvalidStoreURL(
        f"unknown store scheme {scheme!r} in {url!r}; "
        "expected memory://, sqlite:///, postgresql:// or redis://"
    )
