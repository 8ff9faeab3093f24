"""The Redis store tests' shared fixtures: a key prefix of the module's own (dropped after
it), and a blocking store on it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flowmem.stores import open_store
from flowmem.stores.redis._store import RedisStore
from redis_support import drop_prefix, session_prefix, url_with


@pytest.fixture(scope="module")
def prefix() -> Iterator[str]:
    name = session_prefix()
    yield name
    drop_prefix(name)


@pytest.fixture
def store(prefix: str) -> Iterator[RedisStore]:
    opened = open_store(url_with(prefix))
    assert isinstance(opened, RedisStore)
    yield opened
    opened.close()
