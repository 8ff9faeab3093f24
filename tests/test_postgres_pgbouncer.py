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

import getpass
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import pytest

from backends import POSTGRES_URL, unavailable
from flowmem.messages import canonical_messages
from flowmem.store import Store
from flowmem.stores import open_store
from flowmem.testing import StoreContract, fresh_key, store_model_test
from postgres_support import throwaway_schema, with_options

REASON = unavailable("postgres") or (None if shutil.which("pgbouncer") else
                                     "pgbouncer is not installed (apt-get install pgbouncer)")
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def bouncer_url() -> Iterator[str]:
    """A pgbouncer (transaction mode, 3 server connections) in front of the test database."""
    parts = urlsplit(POSTGRES_URL)
    user = parts.username or getpass.getuser()
    folder = tempfile.mkdtemp(prefix="flowmem-pgbouncer-")
    os.chmod(folder, 0o777)  # pgbouncer may run as another user
    port = _free_port()
    ini = os.path.join(folder, "pgbouncer.ini")
    with open(ini, "w", encoding="utf-8") as config:
        config.write(f"""[databases]
flowmem = host={parts.hostname or '127.0.0.1'} port={parts.port or 5432} \
dbname={parts.path.lstrip('/') or 'postgres'} user={user}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
auth_type = any
pool_mode = transaction
default_pool_size = 3
max_client_conn = 100
admin_users = {user}, pgbouncer
logfile = {folder}/pgbouncer.log
pidfile = {folder}/pgbouncer.pid
unix_socket_dir =
""")
    os.chmod(ini, 0o644)
    command = ["pgbouncer", ini]
    if os.geteuid() == 0:
        command[1:1] = ["-u", "postgres"]  # pgbouncer refuses to run as root
    process = subprocess.Popen(command)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.skip(f"pgbouncer did not start (see {folder}/pgbouncer.log)")
                time.sleep(0.05)
        with throwaway_schema("pgbouncer") as (url, _):
            direct = open_store(url)  # migrate directly, then go through the proxy
            direct.close()
            query = urlsplit(url).query
            yield f"postgresql://{user}@127.0.0.1:{port}/flowmem?{query}&prepared=false"
    finally:
        process.terminate()
        process.wait(15)
        shutil.rmtree(folder, ignore_errors=True)


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
