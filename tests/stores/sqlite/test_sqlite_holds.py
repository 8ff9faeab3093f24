"""MEM-12 on SQLite with published holds (#14, ``flowmem.stores._holds``).

An SQLite append is one ``BEGIN IMMEDIATE`` transaction: it takes no key lock
unless an explicit holder (``Store.lock``) has published a hold of its key, in
this process or another. A holder's hold makes appends to its key wait (bounded
by ``lock_timeout``, then unserialized, as MEM-12 says); a holder killed while
holding leaves nothing behind that keeps appends waiting.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowmem.messages import canonical_messages
from flowmem.scopes import StorageKey
from flowmem.store import AppendOutcome
from flowmem.stores import _locks as locks_module
from flowmem.stores._locks import stripe_of
from flowmem.stores.sqlite._group_commit import AppendRequest
from flowmem.stores.sqlite._store import SQLiteStore

pytestmark = pytest.mark.processes

KEY = StorageKey("session", "s1", "chat")
OTHER = StorageKey("session", "s2", "chat")


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _append(store: SQLiteStore, text: str, key: StorageKey = KEY,
            lock_timeout: float = 5.0) -> AppendOutcome:
    return store.append(key, canonical_messages(_user(text)), max_messages=None,
                        lock_timeout=lock_timeout)


def _hold(path: str, flag: str, release: str, killed: bool) -> None:
    """A process holding KEY's lock (spawned): says so in ``flag``, then exits while
    holding (``killed``) or lets go once ``release`` exists."""
    store = SQLiteStore(path)
    with store.lock(KEY, 5.0) as had:
        written = Path(f"{flag}.tmp")  # then renamed: a poller never reads it half written
        written.write_text(str(had))
        os.replace(written, flag)
        if killed:
            os._exit(0)  # no withdrawal: the kernel drops the byte-range lock only
        deadline = time.monotonic() + 30
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.01)
    store.close()


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[tuple[str, Path, Path, list[multiprocessing.Process]]]:
    path, flag, release = str(tmp_path / "holds.db"), tmp_path / "held", tmp_path / "release"
    SQLiteStore(path).close()
    started: list[multiprocessing.Process] = []
    yield path, flag, release, started
    release.write_text("go")
    for process in started:
        process.join(30)


def _start(holder: tuple[str, Path, Path, list[multiprocessing.Process]],
           killed: bool) -> multiprocessing.Process:
    path, flag, release, started = holder
    process = multiprocessing.get_context("spawn").Process(
        target=_hold, args=(path, str(flag), str(release), killed))
    process.start()
    started.append(process)
    deadline = time.monotonic() + 30
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert flag.exists(), "the holder never said it held the key"
    assert flag.read_text() == "True"
    return process


def test_an_append_takes_no_key_lock_while_nobody_holds_its_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MEM-12 by the database's write lock alone: no byte-range lock is taken."""
    store = SQLiteStore(str(tmp_path / "free.db"))
    taken: list[int] = []
    real = locks_module.fcntl.lockf
    monkeypatch.setattr(locks_module.fcntl, "lockf",
                        lambda *args: (taken.append(args[3]), real(*args))[1])
    outcomes = [_append(store, f"u{n}") for n in range(3)]
    store.append_group([AppendRequest(KEY, canonical_messages(_user("g")), None, 5.0)])
    assert [o.serialized for o in outcomes] == [True, True, True]
    assert taken == []
    store.close()


def test_a_hold_in_another_process_makes_an_append_wait(
        holder: tuple[str, Path, Path, list[multiprocessing.Process]]) -> None:
    """While another process holds the key, an append waits its ``lock_timeout`` and then
    runs unserialized (MEM-12); another key's append does not wait; once the holder lets
    go, appends are serialized again and take no lock."""
    path, _, release, _ = holder
    process = _start(holder, killed=False)
    store = SQLiteStore(path)
    holds = store._locks.holds
    assert holds is not None and holds.held(stripe_of(KEY))
    assert _append(store, "while held", lock_timeout=0.2).serialized is False
    assert _append(store, "elsewhere", key=OTHER, lock_timeout=0.0).serialized is True
    release.write_text("go")
    process.join(30)
    assert not holds.held(stripe_of(KEY))
    assert _append(store, "after", lock_timeout=0.0).serialized is True
    assert [m["content"] for m in store.read(KEY)[1]] == ["while held", "after"]
    store.close()


def test_a_holder_killed_while_holding_keeps_no_append_waiting(
        holder: tuple[str, Path, Path, list[multiprocessing.Process]]) -> None:
    """Its hold stays published, but its byte-range lock died with it: the next append
    takes the lock at once, serialized, and withdraws the stale hold."""
    path = holder[0]
    _start(holder, killed=True).join(30)
    store = SQLiteStore(path)
    holds = store._locks.holds
    assert holds is not None and holds.held(stripe_of(KEY))  # published, nobody behind it
    assert _append(store, "after the holder died", lock_timeout=5.0).serialized is True
    assert not holds.held(stripe_of(KEY))
    store.close()


def test_a_published_hold_makes_a_group_take_the_locks(tmp_path: Path) -> None:
    """Group commit: a request whose key is held waits for it (here: past its timeout,
    unserialized), each request still answered alone."""
    store = SQLiteStore(str(tmp_path / "group.db"))
    answers: list[AppendOutcome | Exception] = []
    with store.lock(KEY, 1.0) as had:
        assert had

        def group() -> None:
            answers.extend(store.append_group([
                AppendRequest(KEY, canonical_messages(_user("held")), None, 0.05),
                AppendRequest(OTHER, canonical_messages(_user("free")), None, 0.05)]))

        thread = threading.Thread(target=group)
        thread.start()
        thread.join(10)
    assert [a.serialized for a in answers if isinstance(a, AppendOutcome)] == [False, True]
    store.close()
