"""An append's tail from the store's own copy (flowmem.stores.postgres._tails): the page
history would answer, whoever changed the conversation since (MEM-14), read from the
table only when the copy cannot be trusted.

Each store below is another process's as far as the copy goes (its own Tails), on the
shared server in a throw-away schema; every tail is checked against a fresh history
read, and whether the append read its tail is counted from the statements it sent.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from backends import unavailable
from flowmem.messages import Message, canonical_messages
from flowmem.scopes import StorageKey
from flowmem.store import AppendOutcome
from flowmem.stores.postgres import PostgresStore
from flowmem.stores.sql._program import Batch
from flowmem.testing import fresh_key
from postgres_support import throwaway_schema

REASON = unavailable("postgres")
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

TAIL = 3
_PAGE = "SELECT pos, body FROM messages"
_SAVE = "UPDATE buffers SET count"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with throwaway_schema("tails") as (made, _):
        yield made


@pytest.fixture
def stores(url: str) -> Iterator[tuple[PostgresStore, PostgresStore]]:
    one, other = PostgresStore.from_url(url), PostgresStore.from_url(url)
    yield one, other
    one.close()
    other.close()


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many tail pages the appends read from the table (one number per append: its
    last batch saves the row)."""
    from flowmem.stores.postgres import _sync

    counted: list[int] = []
    sent = _sync._Transaction.batch

    def batch(self: Any, step: Batch) -> Any:
        if step.final and any(sql.startswith(_SAVE) for sql, _ in step.statements):
            counted.append(sum(sql.startswith(_PAGE) for sql, _ in step.statements))
        return sent(self, step)

    monkeypatch.setattr(_sync._Transaction, "batch", batch)
    return counted


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def call(call_id: str) -> Message:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}]}


def append(store: PostgresStore, key: StorageKey, *messages: Message,
           window: int | None = None, tail: int = TAIL) -> AppendOutcome:
    """Append, and check the tail against a history read right after (MEM-14)."""
    outcome = store.append(key, canonical_messages(list(messages)), max_messages=window,
                           lock_timeout=5.0, tail=tail)
    page = store.history(key, last=tail)
    assert outcome.tail is not None
    assert (outcome.tail.messages, outcome.tail.positions, outcome.tail.before,
            outcome.tail.total) == (page.messages, page.positions, page.before, page.total)
    return outcome


def test_mem14_a_store_appending_alone_reads_its_tail_once(
        stores: tuple[PostgresStore, PostgresStore], reads: list[int]) -> None:
    one, _ = stores
    key = fresh_key()
    for n in range(6):
        append(one, key, user(f"m{n}"))
    assert reads == [1, 0, 0, 0, 0, 0]  # the first append of the conversation reads it


def test_mem14_another_stores_append_is_in_the_tail(
        stores: tuple[PostgresStore, PostgresStore], reads: list[int]) -> None:
    one, other = stores
    key = fresh_key()
    append(one, key, user("a"))
    append(one, key, user("b"))
    append(other, key, user("from elsewhere"))
    outcome = append(one, key, user("c"))
    assert [m["content"] for m in outcome.tail.messages] == ["b", "from elsewhere", "c"]
    assert reads == [1, 0, 1, 1]


def test_mem14_an_edit_elsewhere_that_keeps_the_count_is_in_the_tail(
        stores: tuple[PostgresStore, PostgresStore], reads: list[int]) -> None:
    """MEM-15's edit replaces an entry: the count and next position stay, the row's
    transaction does not."""
    one, other = stores
    key = fresh_key()
    append(one, key, user("a"))
    first = append(one, key, user("b"))
    assert other.edit(key, first.tail.positions[-1], user("B, edited"))
    outcome = append(one, key, user("c"))
    assert [m["content"] for m in outcome.tail.messages] == ["a", "B, edited", "c"]
    assert reads == [1, 0, 1]


def test_mem14_a_deleted_and_remade_conversation_is_read_again(
        stores: tuple[PostgresStore, PostgresStore], reads: list[int]) -> None:
    one, other = stores
    key = fresh_key()
    append(one, key, user("a"))
    other.delete(key)
    append(other, key, user("again"))
    outcome = append(one, key, user("b"))
    assert [m["content"] for m in outcome.tail.messages] == ["again", "b"]
    assert reads[-1] == 1


def test_mem14_healing_and_the_window_read_the_tail(
        stores: tuple[PostgresStore, PostgresStore], reads: list[int]) -> None:
    """MEM-3 (a placeholder inside the tail) and the window (entries evicted): the copy is
    not used for them, nor right after."""
    one, _ = stores
    key = fresh_key()
    append(one, key, user("a"))
    append(one, key, call("c1"))
    append(one, key, user("heals c1"))  # MEM-3: a placeholder goes after the call
    append(one, key, user("d"))
    append(one, key, user("e"), window=4)  # evicts
    append(one, key, user("f"))
    assert reads == [1, 0, 1, 1, 1, 1]


def test_mem14_random_interleavings_agree_with_history(
        stores: tuple[PostgresStore, PostgresStore]) -> None:
    """Two stores take turns at random on two conversations, with tails of random length
    and now and then an edit or a window: every tail is the page history answers."""
    rng = random.Random(20261203)
    keys = [fresh_key(), fresh_key()]
    for step in range(60):
        store, key = rng.choice(stores), rng.choice(keys)
        if step > 2 and rng.random() < 0.1:
            page = store.history(key, last=1)
            if page.positions:
                store.edit(key, page.positions[0], user(f"edited {step}"))
            continue
        window = 8 if rng.random() < 0.15 else None
        append(store, key, user(f"m{step}"), window=window, tail=rng.choice([1, 3, 10]))
