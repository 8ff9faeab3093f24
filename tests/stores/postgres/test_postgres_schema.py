"""The PostgreSQL schema: one baseline with its marker, the distribution key, hash
partitions chosen once, and the schemas it refuses (an earlier build's, a newer one's).

The baseline replaces the migration chain of the unreleased builds; a schema one of
them wrote is refused with one error saying how to move its data.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Iterator
from typing import Any

import pytest

from backends import unavailable
from contention import open_at_once
from flowmem.errors import InvalidStoreURL, SchemaError, StoreError
from flowmem.messages import canonical_messages
from flowmem.scopes import StorageKey, conversation_key
from flowmem.stores import open_async_store, open_store
from flowmem.stores.postgres._schema import BASELINE
from flowmem.testing import fresh_key
from postgres_support import admin, throwaway_schema, with_options

REASON = unavailable("postgres")
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

TABLES = {"kv": "id", "buffers": "id", "messages": "buffer_id", "calls": "buffer_id",
          "idempotency": "buffer_id", "erasures": "id"}  # erasures: a scope id's key


def _marker(name: str) -> list[tuple[Any, ...]]:
    with admin() as conn:
        return conn.execute(f'SELECT baseline, partitions FROM "{name}".flowmem_schema'
                            ).fetchall()


def _primary_keys(name: str) -> dict[str, list[str]]:
    """Each table's primary key columns, in order."""
    with admin() as conn:
        rows = conn.execute(
            "SELECT c.relname, a.attname FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true "
            "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum "
            "WHERE n.nspname = %s AND i.indisprimary ORDER BY c.relname, k.ord",
            (name,)).fetchall()
    keys: dict[str, list[str]] = {}
    for table, column in rows:
        keys.setdefault(table, []).append(column)
    return keys


@pytest.fixture
def fresh() -> Iterator[tuple[str, str]]:
    with throwaway_schema("baseline") as made:
        yield made


def test_the_baseline_leads_every_primary_key_with_the_conversation_key(
        fresh: tuple[str, str]) -> None:
    url, name = fresh
    open_store(url).close()
    assert _marker(name) == [(BASELINE, 0)]
    keys = _primary_keys(name)
    for table, column in TABLES.items():
        assert keys[table][0] == column, (table, keys[table])
    with admin() as conn:
        identity = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = %s AND is_identity = 'YES'", (name,)).fetchall()
        tables = {row[0] for row in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s", (name,))}
    assert identity == []  # buffers.id is the conversation key itself
    assert tables == {*TABLES, "flowmem_schema", "flowmem_migrations"}


def test_buffers_id_is_the_conversation_key_and_the_names_are_kept(
        fresh: tuple[str, str]) -> None:
    url, name = fresh
    store = open_store(url)
    try:
        key = fresh_key()
        store.append(key, canonical_messages([{"role": "user", "content": "q"}]),
                     max_messages=None, lock_timeout=5.0)
        value = StorageKey(key.scope, key.scope_id, key.key + "-value")
        store.write(value, 1)
        with admin() as conn:
            buffers = conn.execute(f'SELECT id, scope, scope_id, key FROM "{name}".buffers'
                                   ).fetchall()
            kv = conn.execute(f'SELECT id, scope, scope_id, key FROM "{name}".kv').fetchall()
        assert buffers == [(conversation_key(key), key.scope, key.scope_id, key.key)]
        assert kv == [(conversation_key(value), value.scope, value.scope_id, value.key)]
    finally:
        store.close()


def test_the_baseline_is_made_once_when_many_processes_start_at_once() -> None:
    ctx = mp.get_context("spawn")
    with throwaway_schema("race") as (url, name):
        barrier, results = ctx.Barrier(3), ctx.Queue()
        procs = [ctx.Process(target=open_at_once, args=([url], 3, barrier, results))
                 for _ in range(3)]
        for proc in procs:
            proc.start()
        errors = [error for _ in procs for error in results.get(timeout=120)]
        for proc in procs:
            proc.join(30)
        assert errors == []
        assert _marker(name) == [(BASELINE, 0)]


# -- partitions ----------------------------------------------------------------------------
def test_partitions_hash_partition_each_table_by_its_conversation_key(
        fresh: tuple[str, str]) -> None:
    url, name = fresh
    open_store(with_options(url, partitions=4)).close()
    assert _marker(name) == [(BASELINE, 4)]
    with admin() as conn:
        rows = conn.execute(
            "SELECT c.relname, p.partstrat, a.attname, "
            "(SELECT count(*) FROM pg_inherits WHERE inhparent = c.oid) "
            "FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = p.partattrs[0] "
            "WHERE n.nspname = %s", (name,)).fetchall()
    assert sorted(rows) == sorted((table, "h", column, 4) for table, column in TABLES.items())
    store = open_store(url)  # no partitions in the URL: whatever the schema has
    try:
        key = fresh_key()
        assert store.append(key, canonical_messages([{"role": "user", "content": "q"}]),
                            max_messages=None, lock_timeout=5.0).count == 1
        assert store.read(key)[0]
    finally:
        store.close()


def test_partitions_are_chosen_once(fresh: tuple[str, str]) -> None:
    url, _ = fresh
    open_store(with_options(url, partitions=4)).close()
    with pytest.raises(SchemaError, match="partitions=4"):
        open_store(with_options(url, partitions=8))
    with pytest.raises(SchemaError, match="partitions=4"):
        open_store(with_options(url, partitions=0))


def test_an_unpartitioned_schema_refuses_partitions(fresh: tuple[str, str]) -> None:
    url, _ = fresh
    open_store(url).close()
    with pytest.raises(SchemaError, match="chosen once"):
        open_store(with_options(url, partitions=4))
    open_store(with_options(url, partitions=0)).close()


@pytest.mark.parametrize("value", ["-1", "x", "1.5", "100000"])
def test_a_bad_partitions_option_is_an_invalid_url(value: str) -> None:
    from backends import POSTGRES_URL

    with pytest.raises(InvalidStoreURL, match="partitions"):
        open_async_store(with_options(POSTGRES_URL, partitions=value))


# -- schemas this flowmem refuses ----------------------------------------------------------
_EARLIER_BUILD = (
    "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, "
    "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
    'CREATE TABLE kv (scope TEXT COLLATE "C" NOT NULL, scope_id TEXT COLLATE "C" NOT NULL, '
    'key TEXT COLLATE "C" NOT NULL, value TEXT NOT NULL, PRIMARY KEY (scope, scope_id, key))',
    'CREATE TABLE buffers (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, '
    'scope TEXT COLLATE "C" NOT NULL, scope_id TEXT COLLATE "C" NOT NULL, '
    'key TEXT COLLATE "C" NOT NULL, count BIGINT NOT NULL DEFAULT 0, '
    "next_pos BIGINT NOT NULL DEFAULT 0, pending TEXT NOT NULL DEFAULT '{}', "
    "UNIQUE (scope, scope_id, key))",
    "INSERT INTO schema_version (version) VALUES (1), (2), (3)",
    "INSERT INTO buffers (scope, scope_id, key) VALUES ('session', 's1', 'chat')",
)


@pytest.mark.parametrize("face", ["blocking", "asyncio"])
def test_an_earlier_builds_schema_is_refused_with_how_to_move_its_data(
        fresh: tuple[str, str], face: str) -> None:
    url, name = fresh
    with admin() as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
        conn.execute(f'SET search_path TO "{name}"')
        for statement in _EARLIER_BUILD:
            conn.execute(statement)
    with pytest.raises(SchemaError) as info:
        if face == "blocking":
            open_store(url)
        else:
            import asyncio

            store = open_async_store(url)
            try:
                asyncio.run(store.read(fresh_key()))
            finally:
                asyncio.run(store.aclose())
    message = str(info.value)
    assert "earlier" in message and "flowmem export" in message and "flowmem import" in message
    with admin() as conn:  # left as it was
        assert conn.execute(f'SELECT count(*) FROM "{name}".buffers').fetchone() == (1,)
        assert conn.execute("SELECT to_regclass(%s)",
                            (f'"{name}".flowmem_schema',)).fetchone() == (None,)


def test_a_newer_baseline_is_refused(fresh: tuple[str, str]) -> None:
    url, name = fresh
    open_store(url).close()
    with admin() as conn:
        conn.execute(f'UPDATE "{name}".flowmem_schema SET baseline = 99')
    with pytest.raises(SchemaError, match="upgrade flowmem"):
        open_store(url)


def test_an_unknown_migration_is_refused(fresh: tuple[str, str]) -> None:
    url, name = fresh
    open_store(url).close()
    with admin() as conn:
        conn.execute(f"INSERT INTO \"{name}\".flowmem_migrations (name) "
                     "VALUES ('2031-01-01-from-the-future')")
    with pytest.raises(SchemaError, match="upgrade flowmem"):
        open_store(url)


def test_an_older_baseline_is_refused(fresh: tuple[str, str]) -> None:
    url, name = fresh
    open_store(url).close()
    with admin() as conn:
        conn.execute(f'UPDATE "{name}".flowmem_schema SET baseline = 0')
    with pytest.raises(SchemaError, match="flowmem export"):
        open_store(url)


# -- a collision of conversation keys raises, never shares ----------------------------------
def test_a_conversation_key_collision_is_an_error_never_a_shared_conversation(
        fresh: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from flowmem.stores.postgres import _programs

    url, name = fresh
    store = open_store(url)
    try:
        monkeypatch.setattr(_programs, "conversation_key", lambda key: 42)  # every key collides
        first, second = fresh_key(), fresh_key()
        turn = canonical_messages([{"role": "user", "content": "mine"}])
        assert store.append(first, turn, max_messages=None, lock_timeout=5.0).count == 1
        with pytest.raises(StoreError, match="collision"):
            store.append(second, turn, max_messages=None, lock_timeout=5.0)
        assert store.read(second) == (False, None)
        assert store.history(second).total == 0
        assert not store.delete(second).found
        assert store.read(first)[1] == [{"role": "user", "content": "mine", "metadata": {}}]

        values = StorageKey("user", "u1", "a"), StorageKey("user", "u1", "b")
        store.write(values[0], "a")
        with pytest.raises(StoreError, match="collision"):
            store.write(values[1], "b")
        assert store.read(values[0]) == (True, "a")
        assert store.read(values[1]) == (False, None)
        with admin() as conn:
            assert conn.execute(f'SELECT count(*) FROM "{name}".buffers').fetchone() == (1,)
    finally:
        store.close()
