from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from backends import BACKENDS, SESSION_TAG, Backend, make_backend, unavailable
from flowmem.store import Store


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Each backend in turn; skipped with the reason when it cannot run here."""
    reason = unavailable(request.param)
    if reason:
        pytest.skip(reason)
    return make_backend(request.param, tmp_path)


@pytest.fixture
def store(backend: Backend) -> Iterator[Store]:
    opened = backend.open()
    yield opened
    opened.close()


@pytest.fixture
def reopen(backend: Backend) -> Callable[[], Store] | None:
    return backend.open if backend.persistent else None


@pytest.fixture(autouse=True)
def _close_worlds() -> Iterator[None]:
    """Close the server worlds a test opened (their loop, client and store)."""
    support = sys.modules.get("server_support")
    before = len(support.open_worlds()) if support is not None else 0
    yield
    support = sys.modules.get("server_support")
    if support is not None:
        support.close_worlds(keep=before)


@pytest.fixture(scope="session", autouse=True)
def _close_module_worlds() -> Iterator[None]:
    """Close the worlds test modules opened at import, when the run ends."""
    yield
    support = sys.modules.get("server_support")
    if support is not None:
        support.close_worlds()


@pytest.fixture(scope="session", autouse=True)
def _drop_session_data() -> Iterator[None]:
    """Remove this session's PostgreSQL schema and Redis keys when the run ends."""
    yield
    if unavailable("postgres") is None:
        from postgres_support import admin

        with admin() as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{SESSION_TAG}" CASCADE')
    if unavailable("redis") is None:
        from redis_support import drop_prefix

        drop_prefix(SESSION_TAG)
