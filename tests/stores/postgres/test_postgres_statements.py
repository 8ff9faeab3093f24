"""Every statement of a single-conversation operation names the conversation key.

Each operation runs through the real store (both faces) while its transactions record
every statement they send; each statement must bind the conversation's key and, for
every flowmem table it reads or writes, filter (or insert) on that table's distribution
column — so Citus can route it to the one shard that holds the conversation, and a
hash-partitioned table prunes to one partition.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from backends import unavailable
from flowmem.messages import Message, canonical_messages
from flowmem.scopes import StorageKey, conversation_key
from flowmem.store import Idempotency
from flowmem.stores import open_async_store, open_store
from flowmem.stores.sql._program import Batch, Statement
from flowmem.testing import fresh_key
from postgres_support import throwaway_schema, with_options

REASON = unavailable("postgres")
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

DISTRIBUTION = {"kv": "id", "buffers": "id", "messages": "buffer_id", "calls": "buffer_id",
                "idempotency": "buffer_id"}
_REFERENCE = re.compile(r"\b(FROM|INTO|UPDATE|JOIN)\s+(kv|buffers|messages|calls|idempotency)"
                        r"\b(?:\s+AS\s+(\w+))?", re.IGNORECASE)


@pytest.fixture(scope="module", params=["plain", "partitioned"])
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    with throwaway_schema(f"statements_{request.param}") as (made, _):
        if request.param == "partitioned":
            made = with_options(made, partitions=4)
        open_store(made).close()
        yield made


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[Statement]:
    """Every statement the stores' transactions send (both faces), in order."""
    from flowmem.stores.postgres import _async, _sync

    log: list[Statement] = []
    sent_sync = _sync._Transaction.batch
    sent_async = _async._Transaction.batch

    def batch(self: Any, step: Batch) -> Any:
        log.extend(step.statements)
        return sent_sync(self, step)

    async def abatch(self: Any, step: Batch) -> Any:
        log.extend(step.statements)
        return await sent_async(self, step)

    monkeypatch.setattr(_sync._Transaction, "batch", batch)
    monkeypatch.setattr(_async._Transaction, "batch", abatch)
    return log


def problems(statement: Statement, key: int) -> list[str]:
    """What keeps ``statement`` from being routed by the conversation key ``key``."""
    sql, params = statement
    found: list[str] = []
    if key not in list(params):
        found.append("the conversation key is not one of its parameters")
    references = _REFERENCE.findall(sql)
    if not references:
        found.append("it names no flowmem table")
    for verb, table, alias in references:
        column = DISTRIBUTION[table]
        qualified = rf"(?:\b{alias}\.|(?<![.\w])){column}" if alias else rf"(?<![.\w]){column}"
        if verb.upper() == "INTO":
            if not re.search(rf"INTO\s+{table}\s*\(\s*{column}\b", sql, re.IGNORECASE):
                found.append(f"its INSERT INTO {table} does not lead with {column}")
        elif not re.search(rf"{qualified}\s*=\s*(?:\?|\w+\.{column}\b)", sql):
            found.append(f"{table}{' AS ' + alias if alias else ''} is not filtered on "
                         f"{column}")
    return found


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def assistant(*calls: str) -> Message:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call, "type": "function", "function": {"name": "f", "arguments": "{}"}}
        for call in calls]}


def tool(call: str, content: str = "ok") -> Message:
    return {"role": "tool", "tool_call_id": call, "content": content}


def _operations(store: Any, key: StorageKey, value: StorageKey) -> None:
    """Every single-conversation operation, through every path of the append program:
    new and existing conversations, healing (MEM-3), the late result (MEM-10), the
    window, idempotency keys and their replays, the tail, history pages, edits, values."""
    def append(messages: list[Message], **options: Any) -> Any:
        options.setdefault("max_messages", None)
        return store.append(key, canonical_messages(messages), lock_timeout=5.0, **options)

    idem = Idempotency(f"i-{key.key}", "f1", 3600.0, 1e9)
    append([user("q"), assistant("c1", "c2"), tool("c2")], idempotency=idem, tail=2)
    append([user("q"), assistant("c1", "c2"), tool("c2")], idempotency=idem, tail=2)  # replay
    append([user("heal c1")])
    append([tool("c1", "late")])  # replaces the placeholder
    append([assistant("c3"), tool("c3"), user("more")], max_messages=4, tail=3)  # evicts
    append([assistant("c3")])  # declared before: dropped (MEM-2)
    store.read(key)
    whole = store.history(key)
    page = store.history(key, last=2)
    store.history(key, last=1, before=page.before)
    users = [pos for pos, message in zip(whole.positions, whole.messages, strict=True)
             if message["role"] == "user"]
    assert store.edit(key, users[0], user("edited"))
    assert store.edit(key, users[-1], None)
    store.write(value, {"v": 1}, idempotency=Idempotency(f"w-{key.key}", "f", 3600.0, 1e9))
    store.write(value, {"v": 1}, idempotency=Idempotency(f"w-{key.key}", "f", 3600.0, 1e9))
    store.read(value)
    store.delete(value, idempotency=Idempotency(f"d-{key.key}", "f", 3600.0, 1e9))
    store.delete(value)
    store.write(key, "a value over the conversation", replace=True)  # drops it
    store.delete(key)
    store.read(key)
    store.history(key)


def _check(log: list[Statement], key: StorageKey, value: StorageKey) -> None:
    keys = {conversation_key(key), conversation_key(value)}
    assert len(log) > 40
    unroutable = {}
    for statement in log:
        owner = next((k for k in keys if k in list(statement[1])), conversation_key(key))
        found = problems(statement, owner)
        if found:
            unroutable[statement[0]] = found
    assert unroutable == {}


def test_every_statement_names_the_conversation_key(url: str,
                                                    recorded: list[Statement]) -> None:
    store = open_store(url)
    try:
        key = fresh_key()
        value = StorageKey(key.scope, key.scope_id, key.key + "-value")
        _operations(store, key, value)
    finally:
        store.close()
    _check(recorded, key, value)


def test_every_statement_names_the_conversation_key_asyncio(url: str,
                                                            recorded: list[Statement]) -> None:
    from flowmem.testing import BlockingStore

    store = BlockingStore(open_async_store(url))
    try:
        key = fresh_key()
        value = StorageKey(key.scope, key.scope_id, key.key + "-value")
        _operations(store, key, value)
    finally:
        store.close()
    _check(recorded, key, value)


def test_the_check_catches_a_statement_that_names_no_key() -> None:
    """The checker itself: a fan-out (key listing) and a names-only look-up are caught."""
    key = 7
    assert problems(("SELECT key FROM kv WHERE scope = ? AND scope_id = ?", ("s", "i")), key)
    assert problems(("SELECT id FROM buffers WHERE scope = ? AND scope_id = ? AND key = ?",
                     ("s", "i", "k")), key)
    assert problems(("DELETE FROM idempotency WHERE expires < ?", (1.0,)), key)
    assert problems(("SELECT c.call_id FROM calls AS c JOIN messages AS m ON "
                     "m.result_id = c.call_id WHERE c.buffer_id = ?", (7,)), key)
    assert not problems(("SELECT pos FROM messages WHERE buffer_id = ? AND pos < ?",
                         (7, 3)), key)
    assert not problems(("INSERT INTO calls (buffer_id, call_id, turn_pos, ord) "
                         "VALUES (?, ?, ?, ?)", (7, "c", 1, 0)), key)


def test_the_purge_of_expired_idempotency_keys_names_the_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One write in 64 purges its conversation's expired keys (random: forced here)."""
    from flowmem.stores.postgres import _programs

    monkeypatch.setattr(_programs.random, "randrange", lambda n: 0)
    key = fresh_key()
    idem = Idempotency("i", "f", 60.0, 1e9)
    statements = _programs.PostgresConversations.record_statements(idem, {}, key)
    assert any(sql.startswith("DELETE FROM idempotency") for sql, _ in statements)
    for statement in statements:
        assert problems(statement, conversation_key(key)) == []
