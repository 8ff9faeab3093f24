"""The PostgreSQL store beyond the shared contract: URL, failures, no session state.

The conformance suite and the model test run against PostgreSQL from
test_store_contract.py (the schema: test_postgres_schema.py); here are the
PostgreSQL-specific promises: keys in code point order,
one text encoding for NUL and lone surrogates, the MEM-12 lock id, and — for
connection loss or a server error in the middle of an append — a typed
flowmem error and the buffer exactly as it was (never half an append).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from backends import POSTGRES_URL, unavailable
from flowmem.errors import (
    InvalidStoreURL,
    MissingDependency,
    StoreError,
    StoreUnavailable,
)
from flowmem.messages import Message, canonical_messages
from flowmem.scopes import StorageKey
from flowmem.store import Store
from flowmem.stores import open_store
from flowmem.testing import fresh_key
from postgres_support import admin, throwaway_schema, with_options

REASON = unavailable("postgres")
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


@pytest.fixture(scope="module")
def schema() -> Iterator[tuple[str, str]]:
    with throwaway_schema("store") as (url, name):
        open_store(url).close()
        yield url, name


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def assistant(call: str) -> Message:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": call, "type": "function", "function": {"name": "f"}}]}


def tool(call: str, content: str = "ok") -> Message:
    return {"role": "tool", "tool_call_id": call, "content": content}


def _append(store: Store, key: StorageKey, incoming: list[Message]) -> tuple[int, int]:
    outcome = store.append(key, canonical_messages(incoming), max_messages=None,
                           lock_timeout=5.0)
    return outcome.count, outcome.appended


def _buffer_id(schema: str, key: StorageKey) -> int:
    with admin() as conn:
        row = conn.execute(f'SELECT id FROM "{schema}".buffers WHERE scope = %s '
                           "AND scope_id = %s AND key = %s",
                           (key.scope, key.scope_id, key.key)).fetchone()
    assert row is not None
    return int(row[0])


def _wait_for(conn: Any, query: str, params: tuple[Any, ...], seconds: float = 15) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        row = conn.execute(query, params).fetchone()
        if row is not None:
            return row[0]
        time.sleep(0.02)
    raise AssertionError(f"not seen within {seconds}s: {query}")


# -- opening -------------------------------------------------------------------------------
def test_url_options_are_checked() -> None:
    for bad in ("schema=no-dashes", "pool_max=x", "pool_min=5&pool_max=2", "pool_timeout=0",
                "statement_timeout=-1", "statement_timeout=x", "statement_timeout=inf",
                "prepared=maybe"):
        with pytest.raises(InvalidStoreURL):
            open_store(f"{POSTGRES_URL}{'&' if '?' in POSTGRES_URL else '?'}{bad}")


def test_libpq_parameters_with_spaces_reach_the_server(schema: tuple[str, str]) -> None:
    # libpq's URI decodes %20 but not +: a space re-encoded as + made the server
    # refuse "-c+application_name=..." at connect
    url, _ = schema
    store = open_store(f"{url}&options=-c%20application_name%3Dflowmem_spaced")
    try:
        with admin() as conn:
            store.read(StorageKey("session", "u", "spaced"))
            store.read(StorageKey("session", "u", "spaced"))  # a pooled connection is open
            seen = conn.execute("SELECT count(*) FROM pg_stat_activity "
                                "WHERE application_name = 'flowmem_spaced'").fetchone()
        assert seen is not None and seen[0] >= 1
    finally:
        store.close()


def test_unreachable_server_is_store_unavailable_quickly() -> None:
    began = time.monotonic()
    with pytest.raises(StoreUnavailable):
        open_store("postgresql://127.0.0.1:1/test?connect_timeout=3")
    assert time.monotonic() - began < 5


def test_missing_psycopg_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    for name in [m for m in sys.modules if m.startswith("flowmem.stores.postgres")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(MissingDependency) as info:
        open_store(POSTGRES_URL)
    assert "flowmem[postgres]" in str(info.value)
    assert isinstance(info.value, ImportError)


# -- encoding, order, lock ids ----------------------------------------------------------------
def test_keys_sort_by_code_point_like_sqlite(schema: tuple[str, str]) -> None:
    store = open_store(schema[0])
    try:
        base = fresh_key()
        names = ["b", "Z", "é", "a", "😀", "ÿ", "中", "a b", "A"]
        for name in names:
            store.write(StorageKey(base.scope, base.scope_id, name), name)
        assert store.keys(base.scope, base.scope_id) == sorted(names)
        assert store.keys(base.scope, base.scope_id, after="ÿ") == ["中", "😀"]
    finally:
        store.close()


def test_nul_and_lone_surrogates_are_stored_as_ascii_json(schema: tuple[str, str]) -> None:
    """The one behaviour on every backend: bodies are ASCII JSON text, so they round-trip."""
    url, name = schema
    store = open_store(url)
    try:
        key = fresh_key()
        _append(store, key, [user("a\u0000b\ud800 é")])
        assert store.read(key) == (True, [{"role": "user", "content": "a\u0000b\ud800 é",
                                           "metadata": {}}])
        with admin() as conn:
            row = conn.execute(f'SELECT body FROM "{name}".messages WHERE buffer_id = %s',
                               (_buffer_id(name, key),)).fetchone()
        assert row is not None and row[0].isascii() and "\\u0000" in row[0]
    finally:
        store.close()


def test_mem12_advisory_lock_id_is_a_stable_signed_64_bit_hash() -> None:
    from flowmem.stores.postgres._common import advisory_key

    key = StorageKey("session", "s1", "conv")
    ids = {advisory_key("flowmem", StorageKey("session", f"s{i}", "conv")) for i in range(200)}
    # Every flowmem process and version must agree on it: pinned.
    assert advisory_key("flowmem", key) == -8197949647455296407
    assert all(-(2**63) <= i < 2**63 for i in ids) and any(i < 0 for i in ids)
    assert len(ids) == 200
    assert advisory_key("other", key) != advisory_key("flowmem", key)


def test_mem12_row_wait_may_use_what_is_left_of_lock_timeout(schema: tuple[str, str]) -> None:
    """Once the advisory lock is had, the row may still be waited for, within what is left
    of the append's lock_timeout: a row released in time is no error (MEM-12)."""
    url, name = schema
    store = open_store(url)
    key = fresh_key()
    try:
        _append(store, key, [user("q")])
        holder = admin()
        holder.execute("BEGIN")
        holder.execute(f'SELECT 1 FROM "{name}".buffers WHERE id = %s FOR UPDATE',
                       (_buffer_id(name, key),))
        timer = threading.Timer(0.8, lambda: holder.execute("COMMIT"))
        timer.start()
        began = time.monotonic()
        outcome = store.append(key, canonical_messages([user("after the row wait")]),
                               max_messages=None, lock_timeout=5.0)
        waited = time.monotonic() - began
        timer.join()
        holder.close()
        assert (outcome.serialized, outcome.appended, outcome.count) == (True, 1, 2)
        assert waited >= 0.7  # it did wait for the row (past the 0.5 s grace)
    finally:
        store.close()


# -- failures mid-append ----------------------------------------------------------------------
def test_mem12_connection_killed_mid_append_leaves_the_buffer_as_it_was(
        schema: tuple[str, str]) -> None:
    """pg_terminate_backend while the append has written rows: StoreUnavailable, no trace."""
    url, name = schema
    app = f"flowmem-kill-{os.getpid()}"
    store = open_store(with_options(url, application_name=app))
    key = fresh_key()
    try:
        _append(store, key, [user("q"), assistant("c1"), tool("c1")])
        before = store.history(key)
        blocker = admin()
        blocker.execute("BEGIN")
        # An uncommitted row holding the result id the append will store (MEM-1's unique
        # key): it waits there, after inserting the user turn, the assistant turn and its
        # call.
        blocker.execute(f'INSERT INTO "{name}".messages VALUES (%s, %s, %s, %s, 0, %s)',
                        (_buffer_id(name, key), 1 << 60, "tool", "X", "{}"))
        failure: list[BaseException] = []

        def writer() -> None:
            try:
                _append(store, key, [user("u2"), assistant("X"), tool("X")])
            except BaseException as exc:
                failure.append(exc)

        thread = threading.Thread(target=writer)
        thread.start()
        with admin() as watcher:
            # (the statement's text is no clue: it may be an EXECUTE of a prepared one)
            pid = _wait_for(watcher, "SELECT pid FROM pg_stat_activity WHERE application_name "
                            "= %s AND wait_event_type = 'Lock' AND wait_event <> 'advisory'",
                            (app,))
            watcher.execute("SELECT pg_terminate_backend(%s)", (pid,))
        thread.join(15)
        blocker.execute("ROLLBACK")
        blocker.close()
        assert not thread.is_alive()
        assert len(failure) == 1 and isinstance(failure[0], StoreUnavailable), failure
        after = store.history(key)
        assert (after.messages, after.positions) == (before.messages, before.positions)
        assert _append(store, key, [user("u2"), assistant("X"), tool("X")]) == (6, 3)
    finally:
        store.close()


def test_server_error_mid_append_is_store_error_and_rolls_back(
        schema: tuple[str, str]) -> None:
    """The second row of an append fails on the server: StoreError, nothing stored."""
    url, name = schema
    store = open_store(url)
    key = fresh_key()
    with admin() as conn:
        conn.execute(f"""
            CREATE FUNCTION "{name}".boom() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.body LIKE '%%boom%%' THEN RAISE EXCEPTION 'boom refused'; END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER boom BEFORE INSERT ON "{name}".messages
                FOR EACH ROW EXECUTE FUNCTION "{name}".boom();
        """)
    try:
        _append(store, key, [user("first")])
        before = store.history(key)
        with pytest.raises(StoreError, match="boom refused") as info:
            _append(store, key, [user("fine"), assistant("c9"), user("boom")])
        assert not isinstance(info.value, StoreUnavailable)
        after = store.history(key)
        assert (after.messages, after.positions) == (before.messages, before.positions)
        assert _append(store, key, [user("fine")]) == (2, 1)
    finally:
        with admin() as conn:
            conn.execute(f'DROP TRIGGER boom ON "{name}".messages; '
                         f'DROP FUNCTION "{name}".boom()')
        store.close()


def test_stale_pooled_connections_are_replaced_before_anything_is_sent(
        schema: tuple[str, str]) -> None:
    """Server restart / proxy closing idle connections: the next call still works."""
    url, _ = schema
    app = f"flowmem-stale-{os.getpid()}"
    store = open_store(with_options(url, application_name=app, pool_min=2))
    key = fresh_key()
    try:
        _append(store, key, [user("before")])
        with admin() as conn:
            killed = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM "
                                  "pg_stat_activity WHERE application_name = %s",
                                  (app,)).fetchone()
        assert killed is not None and killed[0] >= 1
        time.sleep(0.1)
        assert _append(store, key, [user("after")]) == (2, 1)
        assert [m["content"] for m in store.history(key).messages] == ["before", "after"]
    finally:
        store.close()


def test_closed_store_raises_store_error(schema: tuple[str, str]) -> None:
    store = open_store(schema[0])
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.read(fresh_key())


# -- transaction pooling ----------------------------------------------------------------------
@pytest.mark.parametrize("prepared", ["false", "true"])
def test_no_session_state_is_left_on_pooled_connections(schema: tuple[str, str],
                                                        prepared: str) -> None:
    """What pgbouncer's transaction mode needs: no session SET, no advisory lock and, with
    ``prepared=false``, no prepared statement (with it on, only flowmem's own ``fm_…``)."""
    url, _ = schema
    store = open_store(with_options(url, pool_min=1, pool_max=1, prepared=prepared))
    key = fresh_key()
    try:
        _append(store, key, [user("q"), assistant("c1")])
        _append(store, key, [user("next")])
        store.write(fresh_key(), {"v": 1})
        with store.lock(key, 1.0) as held:
            assert held
        store.history(key, last=1)
        pool = store._pool  # type: ignore[attr-defined]
        with pool.connection() as conn:
            state = conn.execute("SELECT current_setting('search_path'), "
                                 "current_setting('lock_timeout'), "
                                 "current_setting('statement_timeout'), "
                                 "(SELECT count(*) FROM pg_prepared_statements WHERE "
                                 f"{'true' if prepared == 'false' else 'name NOT LIKE $$fm_%$$'}"
                                 "), (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                 "AND pid = pg_backend_pid())").fetchone()
        assert state == ('"$user", public', "0", "0", 0, 0)
    finally:
        store.close()
