"""Round trips of a PostgreSQL append (and a history page), counted by a real TCP proxy
(#14), on both faces.

The store talks to the server through :class:`round_trip_proxy.CountingProxy`,
which counts each time the client sends after having received: what an append
pays in network latency. The common append — one or more messages to an
existing conversation, no window, the MEM-12 lock had — takes at most TWO:
``BEGIN``, the settings, the MEM-12 lock, the conversation's row
``FOR UPDATE`` and the planner's view; then the whole plan, the row's update
and ``COMMIT``. The uncommon paths (a new conversation, healing MEM-3, the
window) take one more and still store exactly what the rules say; so does
the MEM-12 fallback.

Statements that differ from the plan are errors, never silent (MEM-1, MEM-10):
checked on SQLite and PostgreSQL with the very statements the append sends.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from backends import POSTGRES_URL, unavailable
from flowmem.errors import StoreError
from flowmem.messages import Message, canonical_messages
from flowmem.plan import AddEntry, AppendPlan, ReplacePlaceholder
from flowmem.scopes import StorageKey, conversation_key
from flowmem.store import AppendOutcome, Idempotency
from flowmem.stores.postgres._async import AsyncPostgresStore
from flowmem.stores.postgres._sync import PostgresStore
from flowmem.stores.sql._apply import PendingInRow, apply_plan
from flowmem.stores.sql._conversations import drive
from flowmem.testing import fresh_key
from postgres_support import admin, close_face, throwaway_schema, with_options
from round_trip_proxy import CountingProxy, through

REASON = unavailable("postgres")
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

LOCK = 5.0
FACES = ["blocking", "asyncio"]


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def call(call_id: str) -> Message:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}]}


def result(call_id: str, text: str = "42") -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


class Counted:
    """One face of the store, through the proxy, on ONE pooled connection (warm)."""

    def __init__(self, face: str, url: str, proxy: CountingProxy) -> None:
        self.face, self.proxy = face, proxy
        proxied = with_options(through(proxy, url), pool_min=1, pool_max=1)
        self.loop = asyncio.new_event_loop() if face == "asyncio" else None
        self.store: Any = (AsyncPostgresStore.from_url(proxied) if self.loop
                           else PostgresStore.from_url(proxied))
        self.append(fresh_key(), [user("warm up: the pool's connection is open")])

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        made = getattr(self.store, name)(*args, **kwargs)
        return self.loop.run_until_complete(made) if self.loop else made

    def append(self, key: StorageKey, incoming: list[Message],
               max_messages: int | None = None, lock_timeout: float = LOCK,
               idempotency: Idempotency | None = None,
               tail: int = 0) -> tuple[AppendOutcome, int]:
        """The outcome and the round trips it took."""
        before = self.proxy.count()
        outcome = self._call("append", key, canonical_messages(incoming),
                             max_messages=max_messages, lock_timeout=lock_timeout,
                             idempotency=idempotency, tail=tail)
        return outcome, self.proxy.count() - before

    def history(self, key: StorageKey) -> list[Message]:
        return list(self._call("history", key).messages)

    def page(self, key: StorageKey, **cursor: Any) -> tuple[Any, int]:
        """A history page and the round trips it took."""
        before = self.proxy.count()
        page = self._call("history", key, **cursor)
        return page, self.proxy.count() - before

    def close(self) -> None:
        close_face(self.store, self.loop)


@pytest.fixture(scope="module")
def schema() -> Iterator[tuple[str, str]]:
    with throwaway_schema("round_trips") as (url, name):
        PostgresStore.from_url(url).close()
        yield url, name


@pytest.fixture(params=FACES)
def counted(request: pytest.FixtureRequest, schema: tuple[str, str]) -> Iterator[Counted]:
    parts = urlsplit(POSTGRES_URL)
    with CountingProxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
        store = Counted(request.param, schema[0], proxy)
        try:
            yield store
        finally:
            store.close()


def test_common_append_takes_at_most_two_round_trips(counted: Counted) -> None:
    """MEM-12 lock had, existing conversation, no window: ≤ 2 round trips, whatever the
    messages (a user turn, a call, its result MEM-1, a text answer, several at once)."""
    key = fresh_key()
    counted.append(key, [user("start")])
    appends = [[user("q1")], [call("c1")], [result("c1")],
               [{"role": "assistant", "content": "a1"}],
               [user("q2"), call("c2"), result("c2"), {"role": "assistant", "content": "a2"}],
               [result("c2")]]  # a duplicate result: dropped (MEM-1)
    for incoming in appends:
        outcome, trips = counted.append(key, incoming)
        assert outcome.serialized
        assert trips <= 2, (incoming, trips)
    history = counted.history(key)
    assert [m["role"] for m in history] == ["user", "user", "assistant", "tool", "assistant",
                                            "user", "assistant", "tool", "assistant"]
    assert outcome.appended == 0 and outcome.count == len(history)


def test_idempotent_append_and_its_replay_take_two_round_trips(counted: Counted) -> None:
    """The idempotency key is claimed with the first step, recorded with the last."""
    key = fresh_key()
    counted.append(key, [user("start")])
    idem = Idempotency(f"k-{key.scope_id}", "fp", ttl=3600.0, now=time.time())
    first, trips = counted.append(key, [user("once")], idempotency=idem)
    assert (first.count, first.replayed, trips) == (2, False, 2)
    again, trips = counted.append(key, [user("once")], idempotency=idem)
    assert (again.count, again.replayed, trips) == (2, True, 2)
    assert len(counted.history(key)) == 2


def test_an_append_with_its_tail_still_takes_two_round_trips(counted: Counted) -> None:
    """The tail (the service's echo) is read in the append's last batch, with its COMMIT:
    an HTTP turn is the append's two round trips, no third for the echo; a replay too."""
    key = fresh_key()
    counted.append(key, [user(str(i)) for i in range(5)])
    outcome, trips = counted.append(key, [user("5")], tail=3)
    assert outcome.tail is not None and trips == 2
    assert [m["content"] for m in outcome.tail.messages] == ["3", "4", "5"]
    assert (outcome.tail.total, outcome.tail.before) == (6, outcome.tail.positions[0])
    idem = Idempotency(f"t-{key.scope_id}", "fp", ttl=3600.0, now=time.time())
    counted.append(key, [user("6")], idempotency=idem)
    replay, trips = counted.append(key, [user("6")], idempotency=idem, tail=2)
    assert replay.replayed and replay.tail is not None and trips == 2
    assert [m["content"] for m in replay.tail.messages] == ["5", "6"]


def test_placeholder_replaced_in_two_round_trips(counted: Counted) -> None:
    """MEM-10: a real result overwrites its placeholder in place, in the common two."""
    key = fresh_key()
    counted.append(key, [user("q"), call("late"), user("moving on")])  # heals "late" (MEM-3)
    outcome, trips = counted.append(key, [result("late", "finally")])
    assert trips <= 2 and (outcome.appended, outcome.stats.replaced) == (0, 1)
    assert counted.history(key)[2] == canonical_messages([result("late", "finally")])[0]


def test_uncommon_paths_still_store_what_the_rules_say(counted: Counted) -> None:
    """A new conversation, a healing append (MEM-3: one more per healed turn) and a
    window that evicts (one more): 3 round trips each — and what they store."""
    key = fresh_key()
    outcome, trips = counted.append(key, [user("first"), call("x")])
    assert (outcome.count, trips) == (2, 3)
    outcome, trips = counted.append(key, [user("next")])
    assert (outcome.count, outcome.stats.healed, trips) == (4, 1, 3)
    assert [m["role"] for m in counted.history(key)] == ["user", "assistant", "tool", "user"]
    outcome, trips = counted.append(key, [user("w1"), user("w2")], max_messages=3)
    assert (outcome.count, trips) == (3, 3)  # the turn with the call "x" and its result go
    assert [m["content"] for m in counted.history(key)] == ["next", "w1", "w2"]


def test_mem12_fallback_goes_ahead_unserialized(counted: Counted,
                                                schema: tuple[str, str]) -> None:
    """The MEM-12 lock held elsewhere past lock_timeout: the append goes ahead
    unserialized and stores (one more round trip: the transaction over again without
    the lock; which lock timed out is told by the statement that failed)."""
    key = fresh_key()
    counted.append(key, [user("start")])
    holder = PostgresStore.from_url(schema[0])
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with holder.lock(key, LOCK):
            held.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert held.wait(10)
        outcome, trips = counted.append(key, [user("unserialized")], lock_timeout=0.2)
    finally:
        release.set()
        thread.join()
        holder.close()
    assert (outcome.serialized, outcome.count, trips) == (False, 2, 3)
    outcome, trips = counted.append(key, [user("serialized again")], lock_timeout=0.0)
    assert (outcome.serialized, trips) == (True, 2)  # tried once: free, so had


# -- a statement that differs from the plan is an error, never silent ---------------------
def _broken_plans() -> list[AppendPlan]:
    """Plans made on a view that was wrong: a result already stored, no placeholder."""
    stored = canonical_messages([result("c1")])[0]
    return [AppendPlan((AddEntry(0, stored, answers="c1"),), 1),  # the result is there (MEM-1)
            AppendPlan((ReplacePlaceholder("c1", stored),), 0)]  # it is no placeholder (MEM-10)


def _setup_sql(execute: Any, *, count_in_row: bool = True) -> int:
    """One buffer holding c1's result (SQLite, schema 7: its count is on its newest entry;
    PostgreSQL: its id is its conversation key)."""
    if count_in_row:
        execute("INSERT INTO buffers (id, scope, scope_id, key, count, next_pos) "
                "VALUES (?, 'workflow', 'w', 'k', 1, 2097152)",
                (conversation_key(StorageKey("workflow", "w", "k")),))
    else:
        execute("INSERT INTO buffers (scope, scope_id, key, next_pos) "
                "VALUES ('workflow', 'w', 'k', 2097152)", ())
    buffer_id = int(execute("SELECT id FROM buffers", ())[0][0])
    execute("INSERT INTO messages (buffer_id, pos, role, result_id, healed, body) "
            "VALUES (?, 1048576, 'tool', 'c1', 0, '{}')", (buffer_id,))
    return buffer_id


def test_a_plan_the_rows_contradict_is_refused_on_sqlite(tmp_path: Any) -> None:
    from flowmem.stores.sqlite._schema import prepare

    conn = sqlite3.connect(tmp_path / "broken.db", isolation_level=None)
    prepare(conn, str(tmp_path / "broken.db"))

    def execute(sql: str, params: Any) -> list[Any]:
        return conn.execute(sql, params).fetchall()

    buffer_id = _setup_sql(execute, count_in_row=False)
    for plan in _broken_plans():
        conn.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.IntegrityError):
            drive(apply_plan(buffer_id, 1, 2097152, plan, None, lambda c, a: [],
                             PendingInRow({})), execute)
        conn.execute("ROLLBACK")
    assert execute("SELECT count(*) FROM messages", ()) == [(1,)]


def test_a_plan_the_rows_contradict_is_refused_on_postgres(schema: tuple[str, str]) -> None:
    from flowmem.stores.postgres._common import pg

    with admin() as conn:
        conn.execute(f'CREATE SCHEMA "{schema[1]}_broken"')
        try:
            conn.execute(f'SET search_path TO "{schema[1]}_broken"')
            conn.execute(f'CREATE TABLE buffers (LIKE "{schema[1]}".buffers INCLUDING ALL)')
            conn.execute(f'CREATE TABLE messages (LIKE "{schema[1]}".messages INCLUDING ALL)')
            conn.execute("CREATE UNIQUE INDEX ON messages (buffer_id, result_id) "
                         "WHERE result_id IS NOT NULL")

            def execute(sql: str, params: Any) -> list[Any]:
                cur = conn.execute(pg(sql), tuple(params))
                return cur.fetchall() if cur.description is not None else []

            buffer_id = _setup_sql(execute)
            for plan in _broken_plans():
                conn.execute("BEGIN")
                with pytest.raises(Exception) as info:
                    drive(apply_plan(buffer_id, 1, 2097152, plan, None, lambda c, a: [],
                                     PendingInRow({})), execute)
                assert getattr(info.value, "sqlstate", None) in ("23505", "23502")
                conn.execute("ROLLBACK")
            assert execute("SELECT count(*) FROM messages", ()) == [(1,)]
        finally:
            conn.execute(f'DROP SCHEMA "{schema[1]}_broken" CASCADE')


def test_rows_that_contradict_the_plan_raise_store_error() -> None:
    """The rows are checked after each batch too: a broken invariant is a StoreError."""
    stored = canonical_messages([result("c1")])[0]
    plan = AppendPlan((ReplacePlaceholder("c1", stored),), 0)
    with pytest.raises(StoreError, match="broken invariant"):
        drive(apply_plan(1, 1, 2097152, plan, None, lambda c, a: [], PendingInRow({})),
              lambda sql, p: [])


def test_a_history_page_takes_one_round_trip(counted: Counted) -> None:
    """The count, the value check, the page and the count under a cursor go in ONE batch
    with ``BEGIN`` and ``COMMIT`` (the echo of every HTTP turn reads one)."""
    key = fresh_key()
    counted.append(key, [user(str(i)) for i in range(5)])
    page, trips = counted.page(key, last=2)
    assert [m["content"] for m in page.messages] == ["3", "4"] and page.total == 5
    assert trips == 1
    older, trips = counted.page(key, last=2, before=page.before)
    assert [m["content"] for m in older.messages] == ["1", "2"] and older.total == 3
    assert trips == 1
    empty, trips = counted.page(fresh_key())
    assert empty.messages == [] and empty.total == 0 and trips == 1


def test_a_read_takes_one_round_trip(counted: Counted) -> None:
    """A value, a conversation or nothing: ONE batch with BEGIN and COMMIT (the service
    reads its changes record so, every wave of requests)."""
    value, conversation = fresh_key(), fresh_key()
    counted._call("write", value, {"v": 1})
    counted.append(conversation, [user("a"), user("b")])
    for key, expected in ((value, (True, {"v": 1})), (fresh_key(), (False, None)),
                          (conversation, (True, canonical_messages([user("a"), user("b")])))):
        before = counted.proxy.count()
        assert counted._call("read", key) == expected
        assert counted.proxy.count() - before == 1


def test_an_append_under_retention_still_takes_two_round_trips(counted: Counted) -> None:
    """Retention: dropping the key's expired data rides in the first batch, setting its
    expiry in the last; an append under a policy costs no round trip more, idle or
    absolute, and a read at ``now`` is still one."""
    from flowmem.retention import Expiry

    key = fresh_key()
    now = time.time()
    counted.append(key, [user("start")])
    for expiry in (Expiry(now, now + 60, True), Expiry(now, now + 60, False)):
        before = counted.proxy.count()
        outcome = counted._call("append", key, canonical_messages([user("more")]),
                                max_messages=None, lock_timeout=LOCK, expiry=expiry)
        assert outcome.serialized and counted.proxy.count() - before == 2
    page, trips = counted.page(key, now=now)
    assert (page.total, trips) == (3, 1)
    page, _ = counted.page(key, now=now + 61)
    assert page.total == 0
