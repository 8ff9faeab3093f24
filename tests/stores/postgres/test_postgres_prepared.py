"""Server-side prepared statements of the PostgreSQL store (#14), on a real server.

What is sent (:class:`flowmem.stores.postgres._prepared.Statements`, sans I/O),
and what the session then holds: a text sent a second time on a connection
is ``PREPARE``\\ d and ``EXECUTE``\\ d, then only executed; the connection's
cache is what ``pg_prepared_statements`` lists; an append still takes two
round trips; the cache is an LRU whose evicted statements are
``DEALLOCATE``\\ d; a replaced connection starts empty; a statement the
session does not hold turns prepared statements off and its transaction runs
again — nothing lost, nothing doubled; the conformance suite holds with
``prepared=false`` and with every statement prepared at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from backends import POSTGRES_URL, make_backend, unavailable
from flowmem.messages import Message, canonical_messages
from flowmem.scopes import StorageKey
from flowmem.store import Store
from flowmem.stores import open_store
from flowmem.testing import StoreContract, fresh_key, store_model_test
from postgres_support import admin, close_face, throwaway_schema, with_options
from round_trip_proxy import CountingProxy, through

REASON = unavailable("postgres")
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

FACES = ["blocking", "asyncio"]


def user(text: str) -> Message:
    return {"role": "user", "content": text}


# -- what is sent (no server) ---------------------------------------------------------------
def _kinds(sent: list[tuple[str, Any]]) -> list[str]:
    return [text.split(" ", 1)[0] for text, _ in sent]


def test_a_text_is_prepared_the_second_time_then_only_executed() -> None:
    from flowmem.stores.postgres._prepared import Statements, Switch

    cache, switch = Statements(threshold=2, capacity=8), Switch(True)
    select = ("SELECT a FROM t WHERE b = ? AND c = ?", ("x", 1))
    assert cache.plan([("COMMIT", ())], switch) is None  # no parameters: sent as it is
    first = cache.plan([select], switch)
    assert first is not None and first.statements == [select]
    cache.settle(first, 1)
    second = cache.plan([select, select], switch)  # once prepared, executed twice
    assert second is not None and _kinds(second.statements) == ["PREPARE", "EXECUTE", "EXECUTE"]
    name = cache.names[select[0]][0]
    assert second.statements[0][0] == f"PREPARE {name} AS SELECT a FROM t WHERE b = $1 AND c = $2"
    assert second.statements[1] == (f"EXECUTE {name}(?, ?)", ("x", 1))
    assert second.kept == [1, 2]
    cache.settle(second, 3)
    third = cache.plan([select], switch)
    assert third is not None and _kinds(third.statements) == ["EXECUTE"]
    assert Switch(False).on is False and cache.plan([select], Switch(False)) is None


def test_what_did_not_run_is_not_held() -> None:
    """A PREPARE after the round trip's first error did not run; with no answer at all a
    PREPARE counts as not run (a DEALLOCATE as run): the text is prepared again, under a
    new name."""
    from flowmem.stores.postgres._prepared import Statements, Switch

    cache, switch = Statements(threshold=1, capacity=8), Switch(True)
    select = ("SELECT ?", (1,))
    sending = cache.plan([("UPDATE t SET a = ?", (2,)), select], switch)
    assert sending is not None and _kinds(sending.statements) == [
        "PREPARE", "EXECUTE", "PREPARE", "EXECUTE"]
    cache.settle(sending, 1)  # the first EXECUTE failed: the second PREPARE did not run
    assert list(cache.names) == ["UPDATE t SET a = ?"]
    again = cache.plan([select], switch)
    assert again is not None and _kinds(again.statements) == ["PREPARE", "EXECUTE"]
    cache.settle(again, None)  # cancelled: not known, so not held
    assert "SELECT ?" not in cache.names and cache.serial == 3


def test_the_least_recently_used_is_evicted_and_deallocated_next() -> None:
    from flowmem.stores.postgres._prepared import Statements, Switch

    cache, switch = Statements(threshold=1, capacity=2), Switch(True)
    texts = [(f"SELECT {n} WHERE ? > 0", (1,)) for n in range(3)]
    for text in texts[:2]:
        cache.settle(sent := cache.plan([text], switch), len(sent.statements))  # type: ignore[union-attr, arg-type]
    oldest = cache.names[texts[0][0]][0]
    third = cache.plan([texts[2]], switch)
    assert third is not None and _kinds(third.statements) == ["PREPARE", "EXECUTE"]
    assert cache.evicted == [oldest]
    cache.settle(third, 2)
    nxt = cache.plan([texts[1]], switch)
    assert nxt is not None and nxt.statements[0] == (f"DEALLOCATE {oldest}", ())
    cache.settle(nxt, 0)  # the DEALLOCATE did not run: still to do
    assert cache.evicted == [oldest]
    full = Statements(threshold=1, capacity=1)
    both = full.plan(texts[:2], switch)  # the cache holds only this round trip's own
    assert both is not None and _kinds(both.statements) == ["PREPARE", "EXECUTE", "SELECT"]


def test_a_round_trip_with_large_values_prepares_nothing_new() -> None:
    """PostgreSQL keeps a PREPARE's whole query string, values and all: a round trip whose
    text values pass LARGE prepares nothing, but executes what is already prepared."""
    from flowmem.stores.postgres._prepared import LARGE, Statements, Switch

    cache, switch = Statements(threshold=1, capacity=8), Switch(True)
    small, insert = ("SELECT a FROM t WHERE b = ?", ("x",)), "INSERT INTO t VALUES (?)"
    cache.settle(sent := cache.plan([small], switch), 2)  # type: ignore[arg-type]
    assert sent is not None and _kinds(sent.statements) == ["PREPARE", "EXECUTE"]
    large = cache.plan([small, (insert, ("y" * (LARGE + 1),))], switch)
    assert large is not None and _kinds(large.statements) == ["EXECUTE", "INSERT"]


# -- on the server -----------------------------------------------------------------------
class Face:
    """One face of a store on ONE pooled connection, with a look at that connection."""

    def __init__(self, face: str, url: str) -> None:
        from flowmem.stores.postgres._async import AsyncPostgresStore
        from flowmem.stores.postgres._sync import PostgresStore

        url = with_options(url, pool_min=1, pool_max=1)
        self.loop = asyncio.new_event_loop() if face == "asyncio" else None
        self.store: Any = (AsyncPostgresStore.from_url(url) if self.loop
                           else PostgresStore.from_url(url))

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        made = getattr(self.store, name)(*args, **kwargs)
        return self.loop.run_until_complete(made) if self.loop else made

    def append(self, key: StorageKey, text: str) -> Any:
        return self.call("append", key, canonical_messages([user(text)]),
                         max_messages=None, lock_timeout=5.0)

    def contents(self, key: StorageKey) -> list[Any]:
        return [m["content"] for m in self.call("history", key).messages]

    def on_connection(self, look: Callable[[Any], Any]) -> Any:
        """``look(conn)`` on the pooled connection (``conn.execute`` awaited on asyncio)."""
        if self.loop is None:
            with self.store._pool.connection() as conn:
                return look(conn)

        async def run() -> Any:
            pool = await self.store._opened()
            async with pool.connection() as conn:
                answer = look(conn)
                return (await answer) if asyncio.iscoroutine(answer) else answer
        return self.loop.run_until_complete(run())

    def server_statements(self) -> dict[str, int]:
        """The session's prepared statements: name -> executions so far."""
        sql = ("SELECT name, generic_plans + custom_plans FROM pg_prepared_statements "
               "WHERE name LIKE 'fm\\_%'")
        if self.loop is None:
            return dict(self.on_connection(lambda conn: conn.execute(sql).fetchall()))

        async def fetch(conn: Any) -> Any:
            return await (await conn.execute(sql)).fetchall()
        return dict(self.on_connection(fetch))

    def client_names(self) -> set[str]:
        return set(self.on_connection(
            lambda conn: [name for name, _ in conn.statements.names.values()]))

    def close(self) -> None:
        close_face(self.store, self.loop)


@pytest.fixture(scope="module")
def schema() -> Iterator[str]:
    with throwaway_schema("prepared") as (url, _):
        open_store(url).close()
        yield url


@pytest.fixture(params=FACES)
def face_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def face(face_name: str, schema: str) -> Iterator[Face]:
    opened = Face(face_name, schema)
    yield opened
    opened.close()


def test_an_append_executes_prepared_statements_in_two_round_trips(schema: str,
                                                                    face_name: str) -> None:
    """Once warm, an append prepares nothing new, executes its statements (counted by the
    server) and still takes TWO round trips (counted by a proxy); the client's cache is
    exactly what the session holds."""
    parts = urlsplit(POSTGRES_URL)
    with CountingProxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
        counted = Face(face_name, through(proxy, schema))
        try:
            key = fresh_key()
            for turn in range(3):
                counted.append(key, f"warm {turn}")
            before, trips = counted.server_statements(), proxy.count()
            assert before and set(before) == counted.client_names()
            counted.append(key, "prepared")
            after = counted.server_statements()
            assert proxy.count() - trips - 1 == 2  # (one more: server_statements' own)
            assert set(after) == set(before) == counted.client_names()
            executed = sum(after.values()) - sum(before.values())
            # the row (with its unanswered calls: no view to read for a user message), the
            # message, the save
            assert executed >= 3, (before, after)
            assert counted.contents(key) == ["warm 0", "warm 1", "warm 2", "prepared"]
        finally:
            counted.close()


def test_evicted_statements_are_deallocated(schema: str, face_name: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """An LRU of CAPACITY statements per connection: each evicted one is DEALLOCATEd in the
    next round trip, so the session holds what the client thinks (at most CAPACITY, plus
    the evicted ones not yet deallocated)."""
    from flowmem.stores.postgres import _prepared as postgres_prepared

    monkeypatch.setattr(postgres_prepared, "THRESHOLD", 1)
    monkeypatch.setattr(postgres_prepared, "CAPACITY", 4)
    small = Face(face_name, schema)
    try:
        key = fresh_key()
        for turn in range(4):
            small.append(key, f"turn {turn}")
            small.call("history", key, last=2)
            small.call("write", fresh_key(), {"n": turn})
            server = set(small.server_statements())
            pending = set(small.on_connection(lambda conn: list(conn.statements.evicted)))
            assert server == small.client_names() | pending
            assert len(small.client_names()) <= 4
        serial = small.on_connection(lambda conn: conn.statements.serial)
        assert serial > 8  # many were prepared, and evicted: the session holds few
        assert small.contents(key) == [f"turn {t}" for t in range(4)]
    finally:
        small.close()


def test_a_replaced_connection_starts_with_an_empty_cache(schema: str, face: Face) -> None:
    """The cache is the connection's: the pooled connection killed, the store's next call
    gets a new one whose cache holds nothing of the old one's."""
    key = fresh_key()
    for turn in range(3):
        face.append(key, f"turn {turn}")
    old = face.client_names()
    pid = face.on_connection(lambda conn: conn.info.backend_pid)
    assert old
    with admin() as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    face.append(key, "after")
    assert face.on_connection(lambda conn: conn.info.backend_pid) != pid
    assert not (face.client_names() & old)
    assert set(face.server_statements()) == face.client_names()
    assert face.contents(key) == ["turn 0", "turn 1", "turn 2", "after"]


def test_a_statement_the_session_lacks_turns_preparing_off_and_reruns_the_append(
        face: Face, caplog: pytest.LogCaptureFixture) -> None:
    """The session loses the statements of an append's LAST round trip (the one carrying
    COMMIT) behind the client's back, as a transaction-pooling proxy would: the EXECUTE
    fails (26000), which aborts the transaction before its COMMIT; prepared statements go
    off for the store with ONE warning naming the option, and the append runs again,
    unprepared: stored exactly once."""
    key = fresh_key()
    for turn in range(3):
        face.append(key, f"turn {turn}")

    def drop_last_step(conn: Any) -> Any:
        names = [name for text, (name, _) in conn.statements.names.items()
                 if text.startswith(("INSERT INTO messages", "UPDATE buffers"))]
        assert names
        sql = "; ".join(f"DEALLOCATE {name}" for name in names)
        conn.pgconn.exec_(sql.encode())  # the client's cache still lists them
    face.on_connection(drop_last_step)
    caplog.set_level(logging.WARNING, logger="flowmem")
    outcome = face.append(key, "once")
    face.append(key, "unprepared")
    assert (outcome.count, outcome.appended) == (4, 1)
    assert face.contents(key) == ["turn 0", "turn 1", "turn 2", "once", "unprepared"]
    assert face.store._switch.on is False
    warnings = [r.getMessage() for r in caplog.records if r.name == "flowmem"]
    assert len(warnings) == 1 and "prepared=false" in warnings[0] and "26000" in warnings[0]


def test_an_error_at_an_execute_leaves_nothing_of_the_transaction() -> None:
    """The claim the rerun rests on: in one query string, an EXECUTE (26000) or PREPARE
    (42P05) that fails aborts the transaction, and the COMMIT after it does not run."""
    with admin() as conn:
        conn.execute("CREATE TEMP TABLE claim (x int)")
        conn.execute("PREPARE fm_claim AS SELECT 1")
        for failing, state in (("EXECUTE fm_nowhere(1)", "26000"),
                               ("PREPARE fm_claim AS SELECT 2", "42P05")):
            conn.pgconn.send_query(
                f"BEGIN; INSERT INTO claim VALUES (1); {failing}; COMMIT".encode())
            statuses = []
            while (result := conn.pgconn.get_result()) is not None:
                statuses.append(result.status)
                code = result.error_field(psycopg_diag_sqlstate())
            assert code is not None and code.decode() == state
            assert len(statuses) == 3  # BEGIN, INSERT, the error: the COMMIT did not run
            assert conn.info.transaction_status.name == "INERROR"
            conn.pgconn.exec_(b"ROLLBACK")
            assert conn.execute("SELECT count(*) FROM claim").fetchone() == (0,)


def psycopg_diag_sqlstate() -> Any:
    from psycopg.pq import DiagnosticField

    return DiagnosticField.SQLSTATE


def test_a_text_whose_types_cannot_be_inferred_is_left_unprepared(schema: str) -> None:
    """42P18 at a PREPARE (``? IS NULL`` says nothing of its type): the transaction runs
    again, that text is never prepared by this store, the others still are."""
    from flowmem.stores.postgres._sync import PostgresStore

    store = PostgresStore.from_url(with_options(schema, pool_min=1, pool_max=1))

    def program() -> Any:
        rows = yield ("SELECT ? IS NULL, ?::int + 1", (None, 1))
        return rows

    try:
        answers = [store._run(program, read_only=True)[0] for _ in range(3)]
        assert answers == [[(True, 2)]] * 3
        assert store._switch.on and store._switch.refused == {
            "SELECT ? IS NULL, ?::int + 1"}
    finally:
        store.close()


def test_the_url_option() -> None:
    from flowmem.stores.postgres._common import PostgresOptions

    assert PostgresOptions.from_url("postgresql://h/db").prepared is True
    assert PostgresOptions.from_url("postgresql://h/db?prepared=false").prepared is False
    assert "prepared" not in PostgresOptions.from_url("postgresql://h/db?prepared=0").conninfo


# -- the same results, prepared or not ----------------------------------------------------------
class TestStoreContractUnprepared(StoreContract):
    """MEM-1/2/3/10/11/12/14/15 with ``prepared=false`` (the default run prepares)."""

    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[Store]:
        opened = open_store(self._url(tmp_path))
        yield opened
        opened.close()

    @pytest.fixture
    def reopen(self, tmp_path: Path) -> Callable[[], Store]:
        return lambda: open_store(self._url(tmp_path))

    @staticmethod
    def _url(tmp_path: Path) -> str:
        return with_options(make_backend("postgres", tmp_path).url, prepared="false")


class TestStoreContractPreparedAtOnce(StoreContract):
    """The suite with every statement prepared the FIRST time it is sent (THRESHOLD 1), on
    the asyncio face: every shape the programs send prepares (no 42P18: nothing refused)."""

    @pytest.fixture
    def store(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
        from flowmem.stores import open_async_store
        from flowmem.stores.postgres import _prepared as postgres_prepared
        from flowmem.testing import BlockingStore

        monkeypatch.setattr(postgres_prepared, "THRESHOLD", 1)
        raw = open_async_store(make_backend("postgres", tmp_path).url)
        opened = BlockingStore(raw)
        yield opened
        switch = raw._switch  # type: ignore[attr-defined]
        opened.close()
        assert switch.on and not switch.refused

    @pytest.fixture
    def reopen(self, tmp_path: Path) -> Callable[[], Store]:
        return lambda: open_store(make_backend("postgres", tmp_path).url)


def test_model_unprepared_and_prepared_at_once(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """MEM-1/2/3/10/14 + window: the Hypothesis model test with ``prepared=false``, then
    with every statement prepared at once."""
    from flowmem.stores.postgres import _prepared as postgres_prepared

    url = make_backend("postgres", tmp_path).url
    store_model_test(lambda: open_store(with_options(url, prepared="false")),
                     reopenable=True, max_examples=15)
    monkeypatch.setattr(postgres_prepared, "THRESHOLD", 1)
    store_model_test(lambda: open_store(url), reopenable=True, max_examples=15)
