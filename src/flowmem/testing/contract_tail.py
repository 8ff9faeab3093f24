"""The conformance tests of an append's tail (``append(..., tail=N)``), a part of
:class:`~flowmem.testing.StoreContract`.

An append asked for a tail answers the newest ``N`` entries as it left them,
read in its own atomic unit: the page :meth:`~flowmem.store.Store.history`
would answer with ``last=N`` right after it (MEM-14: the figures of the
append are unchanged by it).
"""

from __future__ import annotations

import threading
import uuid

from ..messages import Message, canonical_messages
from ..scopes import StorageKey
from ..store import AppendOutcome, HistoryPage, Idempotency, Store

__all__ = ["TailContract"]


def _key() -> StorageKey:
    return StorageKey("workflow", f"t-{uuid.uuid4().hex}", "tail")


def _user(text: str) -> Message:
    return {"role": "user", "content": text}


def _append(store: Store, key: StorageKey, incoming: list[Message], tail: int, *,
            window: int | None = None, idempotency: Idempotency | None = None,
            ) -> AppendOutcome:
    return store.append(key, canonical_messages(incoming), max_messages=window,
                        lock_timeout=5.0, idempotency=idempotency, tail=tail)


def _same_page(tail: HistoryPage | None, page: HistoryPage) -> None:
    assert tail is not None, "an append asked for a tail answered none"
    assert (tail.messages, tail.positions, tail.before, tail.total) == (
        page.messages, page.positions, page.before, page.total)
    if tail.encoded is not None:  # the texts, when given, say what the messages say
        assert len(tail.encoded) == len(tail.messages)


class TailContract:
    """``append(..., tail=N)``: the page of the newest ``N`` entries the append left."""

    def test_tail_is_the_history_page_after_the_append(self, store: Store) -> None:
        key = _key()
        for n in range(7):
            outcome = _append(store, key, [_user(f"m{n}")], tail=3)
            _same_page(outcome.tail, store.history(key, last=3))
            assert (outcome.count, outcome.appended) == (n + 1, 1)  # MEM-14
        assert outcome.tail is not None and outcome.tail.before is not None

    def test_no_tail_unless_asked(self, store: Store) -> None:
        key = _key()
        outcome = store.append(key, canonical_messages([_user("a")]), max_messages=None,
                               lock_timeout=5.0)
        assert outcome.tail is None

    def test_tail_longer_than_the_conversation(self, store: Store) -> None:
        key = _key()
        outcome = _append(store, key, [_user("a"), _user("b")], tail=50)
        assert outcome.tail is not None
        assert [m["content"] for m in outcome.tail.messages] == ["a", "b"]
        assert (outcome.tail.before, outcome.tail.total) == (None, 2)

    def test_tail_after_the_window_and_healing(self, store: Store) -> None:
        key = _key()
        call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        _append(store, key, [_user("a"), {"role": "assistant", "content": None,
                                          "tool_calls": [call]}], tail=1)
        outcome = _append(store, key, [_user("b"), _user("c")], tail=4, window=4)  # MEM-3
        _same_page(outcome.tail, store.history(key, last=4))
        assert outcome.tail is not None and len(outcome.tail.messages) == 4
        late = _append(store, key, [{"role": "tool", "tool_call_id": "c1", "content": "x"}],
                       tail=4, window=4)  # MEM-10: replaced in place, inside the tail
        _same_page(late.tail, store.history(key, last=4))

    def test_replayed_append_answers_the_tail_as_it_is_now(self, store: Store) -> None:
        key = _key()
        idem = Idempotency(f"i-{uuid.uuid4().hex}", "f", 3600.0, 1e9)
        _append(store, key, [_user("a")], tail=2, idempotency=idem)
        _append(store, key, [_user("b")], tail=2)
        again = _append(store, key, [_user("a")], tail=2, idempotency=idem)
        assert again.replayed
        _same_page(again.tail, store.history(key, last=2))

    def test_tail_of_concurrent_appends_ends_with_the_own_turn(self, store: Store) -> None:
        """The tail is read in the append's own unit: no other writer's turn lands between
        the append and its tail, so each tail ends with the turn it appended."""
        key = _key()
        ends: list[object] = []

        def writer(name: str) -> None:
            for n in range(5):
                outcome = _append(store, key, [_user(f"{name}{n}")], tail=2)
                assert outcome.tail is not None
                ends.append(outcome.tail.messages[-1]["content"] == f"{name}{n}")

        threads = [threading.Thread(target=writer, args=(name,)) for name in "abc"]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert ends == [True] * 15
