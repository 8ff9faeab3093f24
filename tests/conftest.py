from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from backends import BACKENDS, Backend, make_backend, unavailable
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
