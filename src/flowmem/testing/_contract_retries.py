"""The conformance tests of idempotency keys (exactly-once retries), a part of
:class:`~flowmem.testing.StoreContract`.

A change recorded with an idempotency key is made once: a repeat with the same
key and fingerprint replays the first outcome and changes nothing, another
fingerprint is an :class:`~flowmem.errors.IdempotencyConflict`, and the record
lives its time to live.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

from ..errors import IdempotencyConflict
from ..messages import Message, canonical_messages
from ..scopes import StorageKey
from ..store import DeleteOutcome, Idempotency, Store
from ._contract_messages import assistant, fresh_key, tool, user

__all__ = ["RetryContract"]


def _messages(store: Store, key: StorageKey) -> list[Message]:
    found, value = store.read(key)
    return list(value) if found else []


class RetryContract:
    """Idempotency keys on every backend (mixed into :class:`~flowmem.testing.StoreContract`)."""

    @staticmethod
    def _idem(name: str, fingerprint: str = "f1", now: float = 1e9,
              ttl: float = 3600.0) -> Idempotency:
        return Idempotency(f"{name}-{uuid.uuid4().hex}", fingerprint, ttl, now)

    def test_idempotent_append_repeats_change_nothing(self, store: Store) -> None:
        key = fresh_key()
        idem = self._idem("a")
        turn = canonical_messages([assistant("c1"), tool("c1")])
        first = store.append(key, turn, max_messages=None, lock_timeout=5.0, idempotency=idem)
        again = store.append(key, turn, max_messages=None, lock_timeout=5.0, idempotency=idem)
        assert (first.count, first.appended, first.replayed) == (2, 2, False)
        assert (again.count, again.appended, again.replayed) == (2, 2, True)
        assert len(_messages(store, key)) == 2
        other = Idempotency(idem.key, "f2", idem.ttl, idem.now)
        with pytest.raises(IdempotencyConflict):
            store.append(key, turn, max_messages=None, lock_timeout=5.0, idempotency=other)
        assert len(_messages(store, key)) == 2

    def test_idempotent_write_and_delete(self, store: Store) -> None:
        key = fresh_key()
        write = self._idem("w")
        assert not store.write(key, 1, idempotency=write)
        store.write(key, 2)
        # a late retry of the first write: no effect, and it says it replayed
        assert store.write(key, 1, idempotency=write) is True
        assert store.read(key) == (True, 2)
        delete = self._idem("d")
        assert store.delete(key, idempotency=delete) == DeleteOutcome(True, replayed=False)
        store.write(key, 3)
        # replayed: 3 stays, and the answer is the first call's
        assert store.delete(key, idempotency=delete) == DeleteOutcome(True, replayed=True)
        assert store.read(key) == (True, 3)
        # a delete keeps the key's records: the first write's retry still replays
        assert store.delete(key) == DeleteOutcome(True)
        assert store.write(key, 1, idempotency=write) is True
        assert store.read(key) == (False, None)

    def test_idempotent_delete_replays_its_first_answer(self, store: Store) -> None:
        key = fresh_key()
        store.write(key, {"v": 1})
        delete = self._idem("d")
        assert store.delete(key, idempotency=delete) == DeleteOutcome(True, replayed=False)
        assert store.delete(key, idempotency=delete) == DeleteOutcome(True, replayed=True)
        assert store.read(key) == (False, None)
        # another key is another request: it deletes, and says what it found
        assert store.delete(key, idempotency=self._idem("d")) == DeleteOutcome(False)
        # a first call that found nothing replays "nothing found", even once the key holds
        # a value again: the replay changes nothing
        missing = self._idem("m")
        assert store.delete(key, idempotency=missing) == DeleteOutcome(False, replayed=False)
        store.write(key, 2)
        assert store.delete(key, idempotency=missing) == DeleteOutcome(False, replayed=True)
        assert store.read(key) == (True, 2)
        # the same key for another request is refused and changes nothing
        with pytest.raises(IdempotencyConflict):
            store.delete(key, idempotency=Idempotency(missing.key, "f2", missing.ttl,
                                                      missing.now))
        assert store.read(key) == (True, 2)

    def test_idempotent_delete_of_a_conversation_replays(self, store: Store) -> None:
        key = fresh_key()
        store.append(key, canonical_messages([user("a"), user("b")]), max_messages=None,
                     lock_timeout=5.0)
        delete = self._idem("c")
        assert store.delete(key, idempotency=delete) == DeleteOutcome(True, replayed=False)
        assert store.history(key).messages == []
        store.append(key, canonical_messages([user("new")]), max_messages=None,
                     lock_timeout=5.0)  # another write after the delete
        assert store.delete(key, idempotency=delete) == DeleteOutcome(True, replayed=True)
        assert [m["content"] for m in _messages(store, key)] == ["new"]

    def test_idempotent_delete_expires_after_its_ttl(self, store: Store) -> None:
        key = fresh_key()
        store.write(key, 1)
        idem = self._idem("e", now=1000.0, ttl=10.0)
        assert store.delete(key, idempotency=idem) == DeleteOutcome(True)
        store.write(key, 2)
        later = Idempotency(idem.key, idem.fingerprint, 10.0, 1011.0)  # expired: fresh
        assert store.delete(key, idempotency=later) == DeleteOutcome(True, replayed=False)
        assert store.read(key) == (False, None)

    def test_idempotent_deletes_from_threads_delete_once(self, store: Store) -> None:
        key = fresh_key()
        store.write(key, 1)
        idem = self._idem("t")
        outcomes: list[DeleteOutcome] = []

        def retry() -> None:
            outcomes.append(store.delete(key, idempotency=idem))

        threads = [threading.Thread(target=retry) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(o.replayed for o in outcomes) == [False] + [True] * 5
        assert all(o.found for o in outcomes)

    def test_idempotency_key_expires_after_its_ttl(self, store: Store) -> None:
        key = fresh_key()
        idem = self._idem("t", now=1000.0, ttl=10.0)
        store.append(key, canonical_messages([user("a")]), max_messages=None,
                     lock_timeout=5.0, idempotency=idem)
        later = Idempotency(idem.key, "other", 10.0, 1011.0)  # expired: a fresh key
        outcome = store.append(key, canonical_messages([user("b")]), max_messages=None,
                               lock_timeout=5.0, idempotency=later)
        assert (outcome.appended, outcome.replayed) == (1, False)

    def test_idempotent_retries_from_threads_store_once(self, store: Store) -> None:
        key = fresh_key()
        idem = self._idem("r")
        outcomes: list[Any] = []

        def retry() -> None:
            outcomes.append(store.append(key, canonical_messages([user("once")]),
                                         max_messages=None, lock_timeout=5.0,
                                         idempotency=idem))

        threads = [threading.Thread(target=retry) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(_messages(store, key)) == 1
        assert sorted(o.replayed for o in outcomes) == [False] + [True] * 5
