"""The path watch that spares the SQLite store a ``stat`` per transaction (stores/sqlite_watch.py).

Whatever moves the database file away from its path — deleted, renamed over, moved,
a directory above it moved — the next transaction's check refuses to acknowledge it
(StoreUnavailable), with the watch as with a ``stat``. An event that changes nothing
(a ``chmod``) only sends every later check to ``stat``. A path through a symbolic link
is never watched.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from flowmem.errors import StoreUnavailable
from flowmem.messages import canonical_messages
from flowmem.scopes import StorageKey
from flowmem.stores.sqlite import SQLiteStore
from flowmem.stores.sqlite_watch import PathWatch

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="inotify is Linux's; elsewhere the store stats the path")

KEY = StorageKey("session", "s1", "chat")


def _append(store: SQLiteStore, text: str = "hi") -> int:
    return store.append(KEY, canonical_messages([{"role": "user", "content": text}]),
                        max_messages=None, lock_timeout=5.0).count


def _opened(path: Path) -> SQLiteStore:
    store = SQLiteStore(str(path))
    _append(store)
    return store


def test_a_plain_path_is_watched_and_quiet(tmp_path: Path) -> None:
    store = _opened(tmp_path / "w.db")
    assert store._watch is not None
    for n in range(20):  # commits, checkpoints: no event
        _append(store, str(n))
    assert store._local.events(0) == []
    store.close()


def _delete(path: Path) -> None:
    path.unlink()


def _replace(path: Path) -> None:
    other = path.with_name("other.db")
    other.write_bytes(b"")
    os.replace(other, path)


def _move(path: Path) -> None:
    path.rename(path.with_name("moved.db"))


def _move_folder(path: Path) -> None:
    path.parent.rename(path.parent.with_name(path.parent.name + "-moved"))


@pytest.mark.parametrize("change", [_delete, _replace, _move, _move_folder],
                         ids=["deleted", "replaced", "moved", "folder-moved"])
def test_the_next_transaction_refuses_a_file_the_path_no_longer_names(
        tmp_path: Path, change: Callable[[Path], None]) -> None:
    path = tmp_path / "folder" / "w.db"
    path.parent.mkdir()
    store = _opened(path)
    assert store._watch is not None
    change(path)
    with pytest.raises(StoreUnavailable):
        _append(store, "lost")  # committed into a file nobody opens again: not acknowledged
    store.close()


def test_an_event_that_changes_nothing_leaves_the_stat(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    store = _opened(path)
    os.chmod(path, 0o600)  # IN_ATTRIB: the watch cannot tell, so every check stats
    assert store._local.events(0) != []
    assert _append(store, "still") == 2
    _replace(path)
    with pytest.raises(StoreUnavailable):
        _append(store, "lost")
    store.close()


def test_a_path_through_a_symbolic_link_is_stat_every_time(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    path = tmp_path / "link" / "w.db"
    assert PathWatch.start(str(path)) is None
    store = _opened(path)
    assert store._watch is None and store._local.events is None
    (tmp_path / "other").mkdir()
    os.replace(tmp_path / "link", tmp_path / "unused")
    (tmp_path / "link").symlink_to(tmp_path / "other")  # the path names no file now
    with pytest.raises(StoreUnavailable):
        _append(store, "lost")
    store.close()


def test_closing_the_store_closes_the_watch(tmp_path: Path) -> None:
    store = _opened(tmp_path / "w.db")
    watch = store._watch
    assert watch is not None
    store.close()
    assert store._watch is None and watch._fd == -1


def test_a_watch_dropped_without_close_gives_its_descriptor_back(tmp_path: Path) -> None:
    watch = PathWatch.start(str(tmp_path))
    assert watch is not None
    fd = watch._fd
    os.fstat(fd)
    del watch
    gc.collect()
    with pytest.raises(OSError):
        os.fstat(fd)
