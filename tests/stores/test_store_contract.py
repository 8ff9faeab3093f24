"""The public conformance suite (flowmem.testing) on every backend.

Covers MEM-1, MEM-2, MEM-3, MEM-10, MEM-11, MEM-12, MEM-14, MEM-15 (edit) at
the storage level; the fixtures in conftest.py run it per backend.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from backends import Backend
from flowmem.store import Store
from flowmem.testing import StoreContract, store_model_test


class TestStoreContract(StoreContract):
    @pytest.fixture
    def reopen(self, backend: Backend) -> Callable[[], Store] | None:
        return backend.open if backend.persistent else None


def test_store_equals_pure_model_after_every_step(backend: Backend) -> None:
    """MEM-1/2/3/10/14 + window: the Hypothesis stateful model test, per backend."""
    store_model_test(backend.open, reopenable=backend.persistent)
