"""The erasure part of the conformance suite (:meth:`flowmem.store.Store.erase`).

An erasure deletes every key under one identity scope id and the idempotency
records kept for them, counts what it deleted, finds nothing the second
time, and is safe under concurrent appends: an append racing it is either
erased or refused with :class:`~flowmem.errors.ErasureInProgress`.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass

from ..errors import ErasureInProgress
from ..messages import canonical_messages
from ..scopes import StorageKey, idempotency_prefix
from ..store import Erased, Idempotency, Store
from ._contract_messages import assistant, tool, user

__all__ = ["Attempt", "ErasureContract", "left_behind"]


def _user(tag: str = "u") -> str:
    return f"{tag}-{uuid.uuid4().hex}"


def _append(store: Store, key: StorageKey, text: str, idempotency: str | None = None) -> None:
    idem = (None if idempotency is None else
            Idempotency(idempotency_prefix(key) + idempotency, "f-" + text, 3600.0, time.time()))
    store.append(key, canonical_messages([user(text)]), max_messages=None, lock_timeout=5.0,
                 idempotency=idem)


@dataclass(frozen=True)
class Attempt:
    """One append of a racing writer: when it began and ended (``time.monotonic``, the
    same clock in every process), its marker, and whether it was acknowledged."""

    began: float
    ended: float
    marker: str
    acknowledged: bool


def left_behind(attempts: list[Attempt], found: set[str], erasure_began: float) -> list[str]:
    """The markers ``found`` after an erasure that it should have erased.

    A refused append proves the fence was up when it began, so an append
    acknowledged before the latest refused one began committed under (or
    before) the fence: its message must be gone; so must every message of an
    append acknowledged before the erasure began. Appends acknowledged later
    may have committed after the fence came down (a new conversation)."""
    refused = [a.began for a in attempts if not a.acknowledged]
    fenced_until = max([erasure_began, *refused])
    by_marker = {a.marker: a for a in attempts}
    return sorted(m for m in found
                  if m not in by_marker or not by_marker[m].acknowledged
                  or by_marker[m].ended < fenced_until)


class ErasureContract:
    """Conformance tests of ``erase``; mixed into :class:`~flowmem.testing.StoreContract`."""

    def test_erase_deletes_the_scope_id_and_counts_it(self, store: Store) -> None:
        alice, bob = _user("alice"), _user("bob")
        chat = StorageKey("user", alice, "chat")
        _append(store, chat, "one", "k1")
        store.append(chat, canonical_messages([assistant("c1"), tool("c1")]), max_messages=None,
                     lock_timeout=5.0)
        _append(store, StorageKey("user", alice, "other"), "two")
        store.write(StorageKey("user", alice, "prefs"), {"tone": "short"})
        kept = [StorageKey("user", bob, "chat"), StorageKey("session", alice, "chat"),
                StorageKey("workflow", alice, "chat")]
        for key in kept:
            _append(store, key, "kept", "k1")
        expected = Erased(conversations=2, values=1, messages=4, idempotency_records=1)
        assert store.erase("user", alice, dry_run=True) == expected
        assert store.keys("user", alice) == ["chat", "other", "prefs"]
        assert store.erase("user", alice) == expected
        assert store.keys("user", alice) == []
        assert store.read(chat) == (False, None)
        assert store.history(chat).positions == []
        for key in kept:
            assert store.read(key)[0], key
        assert store.erase("user", alice) == Erased()  # idempotent: nothing left

    def test_an_erased_scope_id_takes_new_appends_afterwards(self, store: Store) -> None:
        alice = _user("alice")
        chat = StorageKey("user", alice, "chat")
        _append(store, chat, "before", "k1")
        store.erase("user", alice)
        _append(store, chat, "after", "k1")  # the idempotency record went with it
        found, messages = store.read(chat)
        assert found and [m["content"] for m in messages] == ["after"]

    def test_erase_racing_appends_leaves_none_behind(self, store: Store) -> None:
        alice = _user("alice")
        keys = [StorageKey("user", alice, f"c{n:02d}") for n in range(12)]
        for key in keys:
            for turn in range(3):
                _append(store, key, f"seed-{key.key}-{turn}")
        attempts: list[Attempt] = []
        stop, lock = threading.Event(), threading.Lock()
        running = threading.Barrier(4 + 1)

        def writer(number: int) -> None:
            turn = 0
            running.wait()
            while not stop.is_set():
                new = turn % 3 == 2  # every third append opens a conversation
                key = (StorageKey("user", alice, f"n{number}-{turn}") if new
                       else keys[(number * 5 + turn) % len(keys)])
                marker, began = f"w{number}-{turn}", time.monotonic()
                try:
                    _append(store, key, marker, marker)
                    acknowledged = True
                except ErasureInProgress:
                    acknowledged = False
                with lock:
                    attempts.append(Attempt(began, time.monotonic(), marker, acknowledged))
                turn += 1
                if not acknowledged:
                    return  # refused: this writer stops (the erasure is under way)

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        running.wait()
        began = time.monotonic()
        erased = store.erase("user", alice)
        stop.set()
        for thread in threads:
            thread.join(60)
        assert erased.conversations >= len(keys)
        found: set[str] = set()
        for name in store.keys("user", alice, limit=1000):
            _, messages = store.read(StorageKey("user", alice, name))
            found |= {m["content"] for m in messages}
        assert left_behind(attempts, found, began) == []
        assert not {m for m in found if m.startswith("seed-")}
