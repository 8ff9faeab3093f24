"""The public conformance suite on the asyncio face of every backend (#12).

One suite, both faces: :class:`flowmem.testing.BlockingStore` drives each
backend's :class:`~flowmem.store.AsyncStore` on an event loop of its own, and
the same :class:`~flowmem.testing.StoreContract` tests (MEM-1, MEM-2, MEM-3,
MEM-10, MEM-11, MEM-12, MEM-14, MEM-15) and the Hypothesis model test run
against it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from backends import BACKENDS, Backend, make_backend, unavailable
from flowmem.store import Store
from flowmem.stores import open_async_store
from flowmem.testing import BlockingStore, StoreContract, store_model_test
from profiles import examples


def _async_unavailable(name: str) -> str | None:
    if name == "redis" and importlib.util.find_spec("flowmem.stores.redis._aio") is None:
        return "the asyncio Redis store is not built yet"
    return unavailable(name)


@pytest.fixture(params=BACKENDS)
def async_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    reason = _async_unavailable(request.param)
    if reason:
        pytest.skip(reason)
    return make_backend(request.param, tmp_path)


def _opener(backend: Backend) -> Callable[[], Store]:
    return lambda: BlockingStore(open_async_store(backend.url))


class TestAsyncStoreContract(StoreContract):
    @pytest.fixture
    def store(self, async_backend: Backend) -> Iterator[Store]:
        opened = _opener(async_backend)()
        yield opened
        opened.close()

    @pytest.fixture
    def reopen(self, async_backend: Backend) -> Callable[[], Store] | None:
        return _opener(async_backend) if async_backend.persistent else None


def test_async_store_equals_pure_model_after_every_step(async_backend: Backend) -> None:
    """MEM-1/2/3/10/14 + window: the stateful model test through the asyncio face.

    Half the blocking face's examples (``test_store_contract.py``): the rules are
    decided by the same planning code; what differs is the asyncio driver under it.
    """
    store_model_test(_opener(async_backend), reopenable=async_backend.persistent,
                     max_examples=examples(20))
