"""The conformance suite and the model test on a hash-partitioned schema (``?partitions=4``):
every table ``PARTITION BY HASH`` of its conversation key; the suite on both faces."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from backends import unavailable
from flowmem.store import Store
from flowmem.stores import open_async_store, open_store
from flowmem.testing import BlockingStore, StoreContract, store_model_test
from postgres_support import throwaway_schema, with_options
from profiles import examples

REASON = unavailable("postgres")
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")
FACES = ("blocking", "asyncio")


@pytest.fixture(scope="module")
def partitioned() -> Iterator[str]:
    with throwaway_schema("partitioned") as (url, _):
        url = with_options(url, partitions=4)
        open_store(url).close()
        yield url


def _opener(url: str, face: str) -> Callable[[], Store]:
    if face == "asyncio":
        return lambda: BlockingStore(open_async_store(url))
    return lambda: open_store(url)


@pytest.fixture(params=FACES)
def face(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class TestPartitionedContract(StoreContract):
    @pytest.fixture
    def store(self, partitioned: str, face: str) -> Iterator[Store]:
        opened = _opener(partitioned, face)()
        yield opened
        opened.close()

    @pytest.fixture
    def reopen(self, partitioned: str, face: str) -> Callable[[], Store] | None:
        return _opener(partitioned, face)


def test_partitioned_store_equals_pure_model_after_every_step(partitioned: str) -> None:
    """MEM-1/2/3/10/14 + window, on the partitioned schema, through the blocking face.

    The statements are the plain schema's, and the blocking face is generated from
    the asyncio one (``scripts/unasync.py``): the plain schema's model test runs on
    both faces, and the conformance suite above runs here on both. 15 examples prove
    the statements read and write the partitioned tables alike.
    """
    store_model_test(_opener(partitioned, "blocking"), reopenable=True,
                     max_examples=examples(15))
