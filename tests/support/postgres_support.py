"""Helpers of the PostgreSQL tests: URL options, an admin connection, a throw-away schema.

The writers and the audit of the contention tests are every backend's:
``contention.py``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from backends import POSTGRES_URL

if TYPE_CHECKING:  # psycopg is imported only when a PostgreSQL test runs
    import psycopg


def with_options(url: str, **options: Any) -> str:
    """``url`` with query options added or replaced."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    query.update({name: str(value) for name, value in options.items()})
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), ""))


def admin() -> psycopg.Connection[tuple[Any, ...]]:
    """A plain autocommit connection to the test database (no flowmem options)."""
    import psycopg

    parts = urlsplit(POSTGRES_URL)
    plain = [(k, v) for k, v in parse_qsl(parts.query)
             if k not in ("schema", "pool_min", "pool_max", "pool_timeout",
                          "statement_timeout", "prepared")]
    return psycopg.connect(urlunsplit((parts.scheme, parts.netloc, parts.path,
                                       urlencode(plain), "")), autocommit=True)


@contextmanager
def throwaway_schema(tag: str) -> Iterator[tuple[str, str]]:
    """``(url, schema)`` of a schema unique to this run, dropped afterwards."""
    schema = f"flowmem_test_{os.getpid()}_{tag}"
    try:
        yield with_options(POSTGRES_URL, schema=schema), schema
    finally:
        with admin() as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def unique_session() -> str:
    return f"s-{uuid.uuid4().hex}"


def close_face(store: Any, loop: Any) -> None:
    """Close a store of either face: ``aclose`` on its ``loop`` (then the loop), or ``close``."""
    if loop:
        loop.run_until_complete(store.aclose())
        loop.close()
    else:
        store.close()
