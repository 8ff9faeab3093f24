"""The PostgreSQL store behind pgbouncer in TRANSACTION pooling mode.

Transaction pooling hands each transaction to whichever server connection is
free, so a store that kept session state (prepared statements, a session
``SET``, session advisory locks) would break here. The whole conformance
suite, the model test and MEM-12 (fallback under a held lock, threads losing
and doubling nothing) run through a pgbouncer started for the test with a
server pool smaller than the number of writers, with ``prepared=false`` as
the docs say. With prepared statements left on, the store notices the first
time a transaction lands on a server connection without them, turns them off
(one warning) and runs that transaction again: every append stored once.
Skips when the ``pgbouncer`` binary is not installed
(``apt-get install pgbouncer``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import pytest

from flowmem.messages import canonical_messages
from flowmem.store import Store
from flowmem.stores import open_store
from flowmem.testing import StoreContract, fresh_key, store_model_test
from pgbouncer_support import pgbouncer, pgbouncer_missing
from postgres_support import throwaway_schema, with_options

REASON = pgbouncer_missing()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


@pytest.fixture(scope="module")
def bouncer_url() -> Iterator[str]:
    """A pgbouncer (transaction mode, 3 server connections) in front of the test database."""
    try:
        started = pgbouncer(3)
        address, user = started.__enter__()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    try:
        with throwaway_schema("pgbouncer") as (url, _):
            direct = open_store(url)  # migrate directly, then go through the proxy
            direct.close()
            query = urlsplit(url).query
            yield f"postgresql://{user}@{address}/flowmem?{query}&prepared=false"
    finally:
        started.__exit__(None, None, None)


def _reconnect_servers(bouncer_url: str) -> None:
    """pgbouncer's console ``RECONNECT``: each server connection is closed once released,
    so the next transactions run on fresh server sessions (no prepared statements)."""
    import psycopg

    parts = urlsplit(bouncer_url)
    with psycopg.connect(host="127.0.0.1", port=parts.port, user=parts.username,
                         dbname="pgbouncer", autocommit=True) as console:
        result = console.pgconn.exec_(b"RECONNECT flowmem")  # the console speaks simple queries
        assert result.status == psycopg.pq.ExecStatus.COMMAND_OK, result.error_message


class TestStoreContractThroughPgbouncer(StoreContract):
    """MEM-1/2/3/10/11/12/14/15 at the storage level, through transaction pooling."""

    @pytest.fixture
    def store(self, bouncer_url: str) -> Iterator[Store]:
        opened = open_store(with_options(bouncer_url, pool_max=8))
        yield opened
        opened.close()

    @pytest.fixture
    def reopen(self, bouncer_url: str) -> Callable[[], Store]:
        return lambda: open_store(bouncer_url)


def test_model_through_pgbouncer(bouncer_url: str) -> None:
    """MEM-1/2/3/10/14 + window: the Hypothesis model test, through transaction pooling."""
    store_model_test(lambda: open_store(bouncer_url), reopenable=True, max_examples=15)


def test_prepared_statements_behind_pgbouncer_fall_back_losing_and_doubling_nothing(
        bouncer_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """prepared=true behind transaction pooling: once the store's statements are prepared,
    pgbouncer's server connections are replaced (RECONNECT), so the next EXECUTEs meet
    sessions without them (26000). The store turns prepared statements off (ONE warning
    naming the option) and runs those transactions again: every append of 6 threads is
    stored exactly once, in order per conversation (MEM-12)."""
    store = open_store(with_options(bouncer_url, prepared="true", pool_max=6))
    keys = [fresh_key() for _ in range(6)]
    try:
        for key in keys:  # each text twice: prepared (THRESHOLD) on whichever server
            for turn in range(3):
                _append(store, key, f"warm {turn}")
        assert store._switch.on  # type: ignore[attr-defined]
        caplog.set_level(logging.WARNING, logger="flowmem")
        _reconnect_servers(bouncer_url)

        def writer(key: object) -> None:
            for turn in range(10):
                _append(store, key, f"turn {turn}")

        threads = [threading.Thread(target=writer, args=(key,)) for key in keys]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not store._switch.on  # type: ignore[attr-defined]
        warnings = [r for r in caplog.records if "prepared=false" in r.getMessage()]
        assert len(warnings) == 1
        for key in keys:
            contents = [m["content"] for m in store.history(key).messages]  # type: ignore[arg-type]
            assert contents == [f"warm {t}" for t in range(3)] + [f"turn {t}" for t in range(10)]
    finally:
        store.close()


def _append(store: Store, key: object, text: str) -> None:
    store.append(key, canonical_messages([{"role": "user", "content": text}]),  # type: ignore[arg-type]
                 max_messages=None, lock_timeout=5.0)
