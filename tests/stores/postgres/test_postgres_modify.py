"""``modify``: a service record's read-modify-write in ONE transaction on one connection
(the row locked), so concurrent changes lose nothing and no change waits for a second
connection of its pool."""

from __future__ import annotations

import threading

import pytest

from backends import unavailable
from flowmem.scopes import StorageKey
from flowmem.stores import open_store
from flowmem.stores._modify import DELETE, KEEP
from postgres_support import throwaway_schema, with_options

REASON = unavailable("postgres")
pytestmark = [pytest.mark.postgres,
              pytest.mark.skipif(REASON is not None, reason=REASON or "")]


def test_concurrent_changes_on_a_pool_of_one_lose_nothing() -> None:
    key = StorageKey("_flowmem", "counters", "one")
    with throwaway_schema("modify") as (url, _):
        store = open_store(with_options(url, pool_max=1))  # one connection for all threads
        try:
            assert store.modify(key, lambda found, _: KEEP, 5.0) == (False, None)  # type: ignore[attr-defined]

            def bump(found: bool, value: object) -> object:
                return {"n": (value["n"] if found else 0) + 1}  # type: ignore[index]

            def worker() -> None:
                for _ in range(10):
                    store.modify(key, bump, 5.0)  # type: ignore[attr-defined]

            threads = [threading.Thread(target=worker) for _ in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            assert store.read(key) == (True, {"n": 40})
            assert store.modify(key, lambda found, _: DELETE, 5.0) == (False, None)  # type: ignore[attr-defined]
            assert store.read(key) == (False, None)
        finally:
            store.close()
