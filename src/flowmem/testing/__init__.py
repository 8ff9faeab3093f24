"""Public test helpers: the backend conformance suite and the model-based test.

A backend (ours or yours) proves it implements :class:`flowmem.store.Store`
by running the same suite every flowmem backend runs::

    import pytest
    from flowmem.testing import StoreContract, store_model_test

    class TestMyStore(StoreContract):
        @pytest.fixture
        def store(self):
            s = MyStore(...)
            yield s
            s.close()

    def test_my_store_equals_model():
        store_model_test(lambda: MyStore(...))

An asyncio backend (an :class:`flowmem.store.AsyncStore`) runs the same
suite through :class:`BlockingStore`, which drives it on an event loop of its
own: one suite, both faces.

Requires ``pytest`` and ``hypothesis`` (``pip install 'flowmem[test]'``).
"""

from __future__ import annotations

from .contract import StoreContract, fresh_key
from .faces import BlockingStore, LoopThread
from .model import StoreModelMachine, store_model_test

__all__ = [
    "BlockingStore",
    "LoopThread",
    "StoreContract",
    "StoreModelMachine",
    "fresh_key",
    "store_model_test",
]
