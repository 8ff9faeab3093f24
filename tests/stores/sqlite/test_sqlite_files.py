"""SQLite files: created owner-only, read-only mode, and an unwritable file.

* The database, its ``-wal``, ``-shm`` and ``.lock`` are created ``0600``
  whatever the umask; an existing file keeps its mode.
* ``sqlite:///x.db?mode=ro``: read, history and keys work; every write raises
  :class:`~flowmem.errors.StoreReadOnly` and changes nothing. A read-only
  open of a missing database creates nothing.
* A database file the process cannot write is opened read-only by itself,
  and leaves no file behind: after ``chmod 644`` a writer works again.
  File modes do not bind root, so when the suite runs as root this part
  runs in a forked child that dropped to the ``nobody`` user.
"""

from __future__ import annotations

import codecs
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from figures import Figure
from flowmem import (
    ExecutionContext,
    InvalidStoreURL,
    Memory,
    StorageKey,
    StoreReadOnly,
    StoreUnavailable,
)
from flowmem.stores.sqlite._store import SQLiteStore

CONTEXT = ExecutionContext(session_id="s")
TURN = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]


def _mode(path: str | Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077], ids=["000", "022", "077"])
def test_database_wal_shm_and_lock_are_created_owner_only(tmp_path: Path, umask: int,
        figure: Figure) -> None:
    db = tmp_path / "private.db"
    previous = os.umask(umask)
    try:
        store = SQLiteStore(str(db))
        store.write(StorageKey("global", "", "k"), "secret")  # -wal and -shm exist while open
        modes = {name: _mode(f"{db}{name}") for name in ("", "-wal", "-shm", ".lock")}
        store.close()
    finally:
        os.umask(previous)
    figure(f"\numask {umask:03o}: modes {({k or 'db': oct(v) for k, v in modes.items()})}")
    assert modes == {"": 0o600, "-wal": 0o600, "-shm": 0o600, ".lock": 0o600}


def test_existing_files_keep_their_modes(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    SQLiteStore(str(db)).close()
    os.chmod(db, 0o640)
    os.chmod(f"{db}.lock", 0o660)
    store = SQLiteStore(str(db))
    store.write(StorageKey("global", "", "k"), 1)
    assert (_mode(db), _mode(f"{db}.lock"), _mode(f"{db}-wal")) == (0o640, 0o660, 0o640)
    store.close()


def _filled(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'ro.db'}"
    with Memory.from_url(url) as memory:
        memory.append("session", "conv", TURN, context=CONTEXT)
        memory.write("session", "k", {"v": 1}, context=CONTEXT)
    return url


def test_read_only_mode_reads_and_refuses_every_write(tmp_path: Path) -> None:
    url = _filled(tmp_path)
    with Memory.from_url(f"{url}?mode=ro") as memory:
        store = memory.store
        assert isinstance(store, SQLiteStore) and store.read_only
        assert memory.read("session", "k", context=CONTEXT).value == {"v": 1}
        assert len(memory.read("session", "conv", context=CONTEXT).value) == 2
        assert len(memory.history("session", "conv", context=CONTEXT).messages) == 2
        writes: list[Callable[[], Any]] = [
            lambda: memory.write("session", "k", 2, context=CONTEXT),
            lambda: memory.delete("session", "k", context=CONTEXT),
            lambda: memory.append("session", "conv", {"role": "user", "content": "x"},
                                  context=CONTEXT),
            lambda: memory.append("session", "new", {"role": "user", "content": "x"},
                                  context=CONTEXT),
            lambda: store.edit(StorageKey("session", "s", "conv"), 0, None),
        ]
        for write in writes:
            with pytest.raises(StoreReadOnly, match="read-only"):
                write()
        assert memory.read("session", "k", context=CONTEXT).value == {"v": 1}
        assert len(memory.read("session", "conv", context=CONTEXT).value) == 2
        assert not memory.read("session", "new", context=CONTEXT).found


def test_read_only_store_sees_a_live_writers_commits(tmp_path: Path) -> None:
    url = _filled(tmp_path)
    with Memory.from_url(url) as writer, Memory.from_url(f"{url}?mode=ro") as reader:
        writer.write("session", "k", {"v": 2}, context=CONTEXT)
        assert reader.read("session", "k", context=CONTEXT).value == {"v": 2}


def test_read_only_open_of_a_missing_database_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailable, match="does not exist"):
        Memory.from_url(f"sqlite:///{tmp_path / 'absent.db'}?mode=ro")
    assert list(tmp_path.iterdir()) == []


def test_mode_rw_never_creates_and_an_unknown_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailable, match="never creates"):
        Memory.from_url(f"sqlite:///{tmp_path / 'absent.db'}?mode=rw")
    with pytest.raises(InvalidStoreURL, match="mode"):
        Memory.from_url(f"sqlite:///{tmp_path / 'absent.db'}?mode=rwx")
    assert list(tmp_path.iterdir()) == []
    _filled(tmp_path)
    with Memory.from_url(f"sqlite:///{tmp_path / 'ro.db'}?mode=rw") as memory:
        memory.write("session", "k", 2, context=CONTEXT)
        assert memory.read("session", "k", context=CONTEXT).value == 2


def _unwritable_scenario(directory: str) -> dict[str, Any]:
    """Runs as an unprivileged user: the owner makes a database, chmods it 444, reads it."""
    url = f"sqlite:///{directory}/ro.db"
    db = f"{directory}/ro.db"
    out: dict[str, Any] = {}
    with Memory.from_url(url) as memory:
        memory.append("session", "conv", TURN, context=CONTEXT)
        memory.write("session", "k", "v", context=CONTEXT)
    os.chmod(db, 0o444)
    before = sorted(os.listdir(directory))
    memory = Memory.from_url(url)
    store = memory.store
    out["read_only"] = isinstance(store, SQLiteStore) and store.read_only
    out["read"] = memory.read("session", "k", context=CONTEXT).value
    out["history"] = len(memory.history("session", "conv", context=CONTEXT).messages)
    try:
        memory.write("session", "k", "w", context=CONTEXT)
        out["write"] = "accepted"
    except Exception as exc:
        out["write"] = type(exc).__name__
    memory.close()
    out["files_added"] = sorted(set(os.listdir(directory)) - set(before))
    os.chmod(db, 0o644)
    with Memory.from_url(url) as writer:
        writer.write("session", "k", "w", context=CONTEXT)
        out["rewritten"] = writer.read("session", "k", context=CONTEXT).value
        out["writer_read_only"] = isinstance(writer.store, SQLiteStore) and \
            writer.store.read_only
    return out


def _unprivileged(scenario: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    """Run ``scenario(directory)`` in a forked child; as ``nobody`` when we are root."""
    directory = tempfile.mkdtemp(prefix="flowmem-ro-")
    root = os.geteuid() == 0
    if root:
        os.chown(directory, 65534, 65534)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        status = 1
        try:
            os.close(read_fd)
            result: dict[str, Any]
            try:
                if root:
                    # nobody cannot read the interpreter's own files where it lives under
                    # /root: what the scenarios load lazily is loaded while still root
                    # (else the first open(..., encoding="ascii") is "unknown encoding")
                    for encoding in ("ascii", "utf-8", "latin-1"):
                        codecs.lookup(encoding)
                    os.setgroups([])
                    os.setgid(65534)
                    os.setuid(65534)
            except PermissionError as exc:
                result = {"skip": f"cannot drop to the nobody user here: {exc}"}
            else:
                result = scenario(directory)
            os.write(write_fd, json.dumps(result).encode())
            status = 0
        except BaseException as exc:
            os.write(write_fd, json.dumps({"error": repr(exc)}).encode())
        finally:
            os._exit(status)
    os.close(write_fd)
    chunks = []
    while chunk := os.read(read_fd, 65536):
        chunks.append(chunk)
    os.close(read_fd)
    os.waitpid(pid, 0)
    shutil.rmtree(directory, ignore_errors=True)
    return dict(json.loads(b"".join(chunks) or b"{}"))


@pytest.mark.processes
def test_unwritable_file_opens_read_only_and_leaves_no_files_behind(figure: Figure) -> None:
    out = _unprivileged(_unwritable_scenario)
    if "skip" in out:
        pytest.skip(out["skip"])
    figure(f"\nunwritable database (chmod 444, {'as nobody' if os.geteuid() == 0 else 'as us'}):"
          f" {out}")
    assert out == {"read_only": True, "read": "v", "history": 2, "write": "StoreReadOnly",
                   "files_added": [], "rewritten": "w", "writer_read_only": False}


def _stale_shm_scenario(directory: str) -> dict[str, Any]:
    """A ``-shm`` left at 0444 by a read-only open of another program (or an older flowmem)."""
    import sqlite3

    db = f"{directory}/stale.db"
    with Memory.from_url(f"sqlite:///{db}") as memory:
        memory.write("session", "k", "v", context=CONTEXT)
    os.chmod(db, 0o444)
    plain = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    plain.execute("SELECT count(*) FROM kv").fetchone()
    plain.close()  # leaves stale.db-wal and stale.db-shm at 0444
    os.chmod(db, 0o644)
    out: dict[str, Any] = {"shm_mode": oct(_mode(f"{db}-shm"))}
    try:
        with Memory.from_url(f"sqlite:///{db}") as memory:
            memory.write("session", "k", "w", context=CONTEXT)
        out["error"] = None
    except Exception as exc:
        out["error"] = type(exc).__name__
        out["hint"] = "delete it while no process has the database open" in str(exc)
    return out


@pytest.mark.processes
def test_a_stale_read_only_shm_is_named_in_the_error(figure: Figure) -> None:
    out = _unprivileged(_stale_shm_scenario)
    if "skip" in out:
        pytest.skip(out["skip"])
    figure(f"\nstale 0444 -shm: {out}")
    assert out == {"shm_mode": "0o444", "error": "StoreReadOnly", "hint": True}
