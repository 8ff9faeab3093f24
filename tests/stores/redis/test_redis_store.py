"""The Redis store beyond the shared contract: URLs, key layout, failures mid-append, locks.

Failures: a server that cannot be reached, a connection cut between the plan
and the script, a connection killed while idle, a server error inside the
script. Each ends in a typed flowmem error (or a whole append) and never in
half an append. The contract suite and the model test run on Redis through
tests/test_store_contract.py.
"""

from __future__ import annotations

import socket
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends import REDIS_URL, unavailable
from flowmem import (
    HEALED_CONTENT,
    InvalidInput,
    InvalidStoreURL,
    KeyConflict,
    MissingDependency,
    StorageKey,
    StoreError,
    StoreUnavailable,
    append,
    canonical_message,
)
from flowmem.plan import SLOT
from flowmem.stores import open_store
from flowmem.stores._codec import encode
from flowmem.stores.redis._keys import key_names, split_url
from flowmem.stores.redis._store import RedisStore
from flowmem.stores.sqlite._store import SQLiteStore
from redis_support import (
    CuttableProxy,
    msgs,
    raw_client,
    result,
    turn,
    url_with,
    user,
)

pytestmark = pytest.mark.skipif(unavailable("redis") is not None,
                                reason=unavailable("redis") or "")


def fresh() -> StorageKey:
    return StorageKey("workflow", f"t-{uuid.uuid4().hex}", "conv")


def add(store: Any, key: StorageKey, *raw: dict[str, Any], window: int | None = None,
        lock_timeout: float = 5.0) -> tuple[int, int]:
    outcome = store.append(key, msgs(*raw), max_messages=window, lock_timeout=lock_timeout)
    return outcome.count, outcome.appended


# -- URLs and layout -----------------------------------------------------------------------
def test_url_options_are_flowmems_or_redis_pys() -> None:
    parts = split_url("redis://h:1/2?prefix=app:mem&lock_ttl=2.5&socket_timeout=3")
    assert (parts.url, parts.prefix, parts.lock_ttl) == ("redis://h:1/2?socket_timeout=3",
                                                         "app:mem", 2.5)
    assert (parts.cluster, parts.nodes, parts.db) == (None, (("h", 1),), 2)
    seeds = split_url("redis://u:p@a:7000,b:7001/0?node=c:7002&cluster=yes&prefix=x")
    assert seeds.url == "redis://u:p@a:7000/0" and seeds.cluster is True
    assert seeds.nodes == (("a", 7000), ("b", 7001), ("c", 7002))
    for bad in ("redis://h/0?lock_ttl=soon", "redis://h/0?decode_responses=true",
                "redis://h/0?prefix=a{b}", "redis://h/0?lock_ttl=0", "redis://h/0?bogus=1",
                "redis://h/0?cluster=maybe", "redis://a:1,b:2/0?cluster=no",
                "redis://h:x/0", "redis://h/zero"):
        with pytest.raises(InvalidStoreURL):
            open_store(bad)


def test_missing_redis_py_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)
    with pytest.raises(MissingDependency, match=r"flowmem\[redis\]"):
        open_store(REDIS_URL)


def test_one_buffer_one_hash_slot_and_names_never_collide() -> None:
    from redis.crc import key_slot

    awkward = StorageKey("user", "a:{b}%", "k}:{x")
    names = key_names(b"fm", awkward)
    assert len({key_slot(k) for k in names.keys}) == 1
    assert all(k.startswith(b"{fm:user:a%3A%7Bb%7D%25:k%7D%3A%7Bx}:") for k in names.keys)
    pairs = [StorageKey("user", "a:b", "c"), StorageKey("user", "a", "b:c"),
             StorageKey("user:a", "b", "c"), StorageKey("user", "a%3Ab", "c")]
    assert len({key_names(b"fm", k).meta for k in pairs}) == len(pairs)


def test_bodies_are_the_sql_stores_ascii_json(store: RedisStore) -> None:
    key = fresh()
    message = canonical_message({"role": "user", "content": "a\u0000b \ud800 é 漢"})
    add(store, key, message)
    client = raw_client()
    try:
        stored = client.hget(key_names(store.prefix.encode(), key).body, "0")
    finally:
        client.close()
    assert stored == encode(message).encode("ascii")
    assert store.read(key) == (True, [message])


# -- failures: typed errors, never half an append ----------------------------------------------
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_server_is_store_unavailable_for_every_operation(prefix: str) -> None:
    with pytest.raises(StoreUnavailable):  # opening fails fast
        open_store(f"redis://127.0.0.1:{_closed_port()}/0?socket_connect_timeout=1")
    proxy = CuttableProxy()
    down = open_store(url_with(prefix, proxy.url))
    proxy.cut()  # the server goes away under an open store
    key = fresh()
    calls = [lambda: down.read(key), lambda: down.write(key, 1), lambda: down.delete(key),
             lambda: down.append(key, msgs(user("x")), max_messages=None, lock_timeout=0.1),
             lambda: down.history(key), lambda: down.keys("workflow", "x"),
             lambda: down.lock(key, 0.1).__enter__(), lambda: down.edit(key, 0, None)]
    for call in calls:
        with pytest.raises(StoreUnavailable):
            call()
    down.close()
    with pytest.raises(StoreError, match="closed"):
        down.read(key)


def test_connection_cut_between_plan_and_script_leaves_the_buffer_as_it_was(
        store: RedisStore, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """MEM-3/MEM-10 append (heals, replaces, adds) cut after planning: nothing of it lands."""
    import flowmem.stores.redis._append as redis_store

    key = fresh()
    add(store, key, user("q"), turn("c1", "c2"), result("c1"))
    before = store.history(key)
    proxy = CuttableProxy()
    proxied = open_store(url_with(prefix, proxy.url, lock_ttl=0.5))
    real = redis_store.plan_append

    def plan_then_cut(view: Any, incoming: Any) -> Any:
        planned = real(view, incoming)
        proxy.cut()  # after the read, before the script
        return planned

    monkeypatch.setattr(redis_store, "plan_append", plan_then_cut)
    with pytest.raises(StoreUnavailable):
        add(proxied, key, user("next"), result("c2", "late"), turn("c3"))
    monkeypatch.undo()
    assert store.history(key) == before
    # the cut writer's lock lease ran out; the next append is serialized and whole
    time.sleep(0.6)
    outcome = store.append(key, msgs(user("next")), max_messages=None, lock_timeout=1.0)
    assert outcome.serialized
    expected = append(before.messages, msgs(user("next")))
    assert store.read(key) == (True, expected.messages)
    proxied.close()


def test_connection_killed_while_idle_the_append_lands_once(
        prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """CLIENT KILL of the store's connections between plan and script: the pool
    reconnects before the script is sent, so the append lands whole, once (MEM-1)."""
    import flowmem.stores.redis._append as redis_store

    name = f"fmkill{uuid.uuid4().hex[:8]}"
    killer = raw_client()
    writer = open_store(url_with(prefix, client_name=name))
    key = fresh()
    add(writer, key, turn("c1"))
    real = redis_store.plan_append
    killed: list[str] = []

    def plan_then_kill(view: Any, incoming: Any) -> Any:
        for client in killer.client_list():
            if client["name"] == name:
                killer.client_kill_filter(_id=client["id"])
                killed.append(client["id"])
        return real(view, incoming)

    monkeypatch.setattr(redis_store, "plan_append", plan_then_kill)
    assert add(writer, key, result("c1"), user("u")) == (3, 2)
    monkeypatch.undo()
    assert killed
    assert writer.read(key) == (True, append(msgs(turn("c1")), msgs(result("c1"), user("u")))
                                .messages)
    writer.close()
    killer.close()


def test_server_error_inside_the_script_leaves_the_buffer_as_it_was(store: RedisStore) -> None:
    """A key of the buffer with the wrong type: the script refuses before its first write."""
    key = fresh()
    add(store, key, user("q"), turn("c1"), result("c1"))
    before = store.history(key)
    names = key_names(store.prefix.encode(), key)
    client = raw_client()
    try:
        saved = client.dump(names.info)
        client.delete(names.info)
        client.set(names.info, "not a hash")
        with pytest.raises(StoreError) as failure:
            add(store, key, turn("c2"), result("c2"), user("u"))
        assert not isinstance(failure.value, StoreUnavailable)
        assert store.history(key) == before
        version = client.hget(names.meta, "ver")
        # a malformed plan is refused before the first write too
        from redis.exceptions import ResponseError

        from flowmem.stores.redis import _scripts as lua

        client.delete(names.info)
        client.restore(names.info, 0, saved)
        with pytest.raises(ResponseError, match=r"truncated plan|bad plan"):
            client.eval(lua.APPLY, len(names.keys), *names.keys,
                        "", 1000, "new", SLOT, "", "", 0, "0", 0, "", "", "", "", 0, "*",
                        "A", "user", "{}", "", 0, 1)
        assert client.hget(names.meta, "ver") == version
        assert store.history(key) == before
    finally:
        client.close()
    assert add(store, key, turn("c2"), result("c2"), user("u")) == (6, 3)


def test_write_between_plan_and_script_is_a_key_conflict_and_the_value_stays(
        store: RedisStore, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import flowmem.stores.redis._append as redis_store

    key = fresh()
    add(store, key, user("q"))
    other = open_store(url_with(prefix))
    real = redis_store.plan_append

    def plan_then_overwrite(view: Any, incoming: Any) -> Any:
        other.write(key, {"plain": True}, replace=True)
        return real(view, incoming)

    monkeypatch.setattr(redis_store, "plan_append", plan_then_overwrite)
    with pytest.raises(KeyConflict):
        add(store, key, user("x"))
    assert store.read(key) == (True, {"plain": True})
    names = key_names(store.prefix.encode(), key)
    client = raw_client()
    try:
        assert client.exists(names.lock) == 0  # the conflicting append released its lock
    finally:
        client.close()
    other.close()


# -- MEM-12 lock --------------------------------------------------------------------------
def test_mem12_lock_released_after_every_append_and_lease_expires(prefix: str) -> None:
    store = open_store(url_with(prefix, lock_ttl=1.0))
    assert isinstance(store, RedisStore)
    key = fresh()
    names = key_names(store.prefix.encode(), key)
    client = raw_client()
    try:
        add(store, key, user("a"))
        assert client.exists(names.lock) == 0
        assert client.set(names.lock, "crashed-holder", nx=True, px=30_000)  # never released
        outcome = store.append(key, msgs(user("b")), max_messages=None, lock_timeout=0.05)
        assert (outcome.serialized, outcome.appended) == (False, 1)
        assert client.get(names.lock) == b"crashed-holder"  # a fallback never steals it
        client.pexpire(names.lock, 50)  # the crashed holder's lease runs out
        while client.exists(names.lock):
            time.sleep(0.01)
        outcome = store.append(key, msgs(user("c")), max_messages=None, lock_timeout=0.05)
        assert (outcome.serialized, outcome.appended) == (True, 1)
        with store.lock(key, 1.0) as held, store.lock(key, 0.05) as second:
            assert (held, second) == (True, False)
        assert client.exists(names.lock) == 0
    finally:
        client.close()
        store.close()


# -- keys, window -------------------------------------------------------------------------
def test_keys_with_awkward_names_paged_and_stale_entries_skipped(store: RedisStore) -> None:
    scope_id = f"t-{uuid.uuid4().hex}"
    names = ["a:b", "a{x}", "a}%", "é", "b", "漢"]
    for name in names:
        store.write(StorageKey("workflow", scope_id, name), name)
    add(store, StorageKey("workflow", scope_id, "a:conv"), user("x"))
    everything = sorted([*names, "a:conv"])
    assert store.keys("workflow", scope_id) == everything
    assert store.keys("workflow", scope_id, prefix="a") == ["a:b", "a:conv", "a{x}", "a}%"]
    assert store.keys("workflow", scope_id, after="a{x}", limit=2) == ["a}%", "b"]
    store.delete(StorageKey("workflow", scope_id, "a:b"))
    index = key_names(store.prefix.encode(), StorageKey("workflow", scope_id, "")).index
    client = raw_client()
    try:
        client.zadd(index, {"a:stale": 0})  # an index entry whose key is gone
    finally:
        client.close()
    assert store.keys("workflow", scope_id, prefix="a", limit=2) == ["a:conv", "a{x}"]
    assert store.keys("workflow", scope_id) == [n for n in everything if n != "a:b"]


def test_window_evicts_turns_with_their_results_wherever_they_stand(store: RedisStore) -> None:
    key = fresh()
    first = msgs(user("q"), turn("c1", "c2"), result("c1"), user("late"), result("c2"),
                 turn("c3"), user("u"), result("c3", "after the heal"))
    add(store, key, *first)
    model = append([], first).messages
    for window in (9, 6, 3, 1):
        outcome = add(store, key, user(f"w{window}"), window=window)
        expected = append(model, msgs(user(f"w{window}")), max_messages=window)
        assert outcome == (expected.count, 1)
        model = expected.messages
        assert store.read(key) == (True, model)


# -- MEM-15: the admin edit path against the SQLite store (the SQL statements Lua mirrors) ----
_IDS = st.sampled_from(["c0", "c1", "c2", "c3"])
_MESSAGE = st.one_of(
    st.builds(user, st.sampled_from(["hi", "next"])),
    st.builds(lambda ids: turn(*ids), st.lists(_IDS, min_size=1, max_size=3)),
    st.builds(result, _IDS, st.sampled_from(["r1", "r2"])),
    st.builds(lambda c: {"role": "tool", "tool_call_id": c, "content": HEALED_CONTENT,
                         "metadata": {"healed": True}}, _IDS),
)
_STEP = st.one_of(
    st.tuples(st.just("append"), st.lists(_MESSAGE, min_size=1, max_size=3),
              st.none() | st.integers(1, 6)),
    st.tuples(st.just("edit"), st.integers(0, 30), st.none() | _MESSAGE),
)


def _outcome(call: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        outcome = call(*args, **kwargs)
    except InvalidInput as refused:  # e.g. an edit that would store a result twice (MEM-1)
        return type(refused), str(refused)
    except StoreError as failed:  # e.g. no free position for placeholders (see below)
        return type(failed)
    return (outcome.count, outcome.appended) if hasattr(outcome, "appended") else outcome


@pytest.fixture(scope="module")
def sqlite_reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SQLiteStore]:
    reference = SQLiteStore(str(tmp_path_factory.mktemp("reference") / "ref.db"),
                            synchronous="off")
    yield reference
    reference.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(steps=st.lists(_STEP, min_size=1, max_size=12))
def test_mem15_edits_then_appends_equal_the_sqlite_store(store: RedisStore,
                                                         sqlite_reference: SQLiteStore,
                                                         steps: list[Any]) -> None:
    key = fresh()
    reference = sqlite_reference
    for kind, first, second in steps:
        if kind == "append":
            batch = msgs(*first)
            assert _outcome(store.append, key, batch, max_messages=second,
                            lock_timeout=5) == _outcome(reference.append, key, batch,
                                                        max_messages=second, lock_timeout=5)
        else:
            positions = reference.history(key).positions
            position = positions[first % len(positions)] if positions else first
            assert _outcome(store.edit, key, position, second) == _outcome(
                reference.edit, key, position, second)
        assert store.read(key) == reference.read(key)
        assert store.history(key) == reference.history(key)
