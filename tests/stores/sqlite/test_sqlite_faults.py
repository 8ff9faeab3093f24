"""SQLite under faults: opens racing, the file deleted or replaced while open.

* **First-open race.** 8 processes open the same brand-new database at once,
  25 times (a new database each round), each open followed by a write and a
  read: every open succeeds (they take turns under the setup lock in the
  ``.lock`` file; a busy answer is retried within ``busy_timeout``). The
  same for an existing database. ``-m slow`` runs 250 rounds with 2 threads
  per process.
* **Deleted under writers.** 2 writer processes append while the database
  (main file, ``-wal``, ``-shm``) is deleted: every append that starts after
  the deletion raises :class:`~flowmem.errors.StoreUnavailable`, none is
  acknowledged, and every acknowledged append is in the file that was
  deleted (a hard link taken just before keeps it countable): acknowledged
  and lost 0. A process opening after the deletion gets a new, empty
  database that the old writers never write into (no split brain).
* **Replaced**, and **deleted with leftovers**: the store refuses from then
  on; a new open refuses leftovers of a deleted database instead of
  replaying its WAL into a new file.

Each test records its figures (listed at the end of the run).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from contention import (
    CONTEXT,
    KEY,
    SCOPE,
    ack_writer,
    audit,
    batch_expected,
    hold_lock,
    open_at_once,
    read_acks,
)
from figures import Figure
from flowmem import ExecutionContext, Memory, StorageKey, StoreUnavailable, resolve_scope
from flowmem.stores.sqlite._store import SQLiteStore

pytestmark = pytest.mark.processes

WRITERS_CONTEXT = ExecutionContext(session_id="deleted")


def _opens_at_once(tmp_path: Path, processes: int, rounds: int, threads: int,
                   fresh: bool) -> tuple[int, list[str]]:
    urls = [f"sqlite:///{tmp_path / (f'new-{r}.db' if fresh else 'existing.db')}"
            for r in range(rounds)]
    if not fresh:
        SQLiteStore(str(tmp_path / "existing.db")).close()
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=open_at_once, args=(urls, threads, barrier, results))
             for _ in range(processes)]
    for proc in procs:
        proc.start()
    errors = [error for _ in procs for error in results.get(timeout=300)]
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    return processes * rounds * threads, errors


@pytest.mark.parametrize("fresh", [True, False], ids=["new", "existing"])
def test_first_open_race_8_processes_x_25_opens_all_succeed(tmp_path: Path,
                                                            fresh: bool, figure: Figure) -> None:
    opens, errors = _opens_at_once(tmp_path, 8, 25, 1, fresh)
    figure(f"\nfirst-open race ({'new' if fresh else 'existing'} database): 8 processes x 25 "
          f"opens at once = {opens} opens (each with a write and a read), "
          f"{len(errors)} failed {sorted(set(errors))[:3]}")
    assert errors == []


@pytest.mark.slow
def test_first_open_race_long(tmp_path: Path, figure: Figure) -> None:
    opens, errors = _opens_at_once(tmp_path, 8, 250, 2, True)
    figure(f"\nfirst-open race, long: 8 processes x 2 threads x 250 new databases = {opens} "
          f"opens, {len(errors)} failed {sorted(set(errors))[:3]}")
    assert errors == []


def _wait(predicate: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "the writers made no progress"
        time.sleep(0.02)


def _mark(paths: list[str]) -> None:
    for path in paths:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.write(fd, b"D\n")
        os.close(fd)


@dataclass
class Deletion:
    acknowledged: int
    stored_turns: int
    lost: int
    duplicates_torn_reordered: int
    started_after: int
    raised_after: int
    acknowledged_after: int
    errors: dict[str, int]
    new_database: list[str]


def _delete_under_two_writers(tmp_path: Path) -> Deletion:
    """2 writer processes append; ``rm x.db x.db-wal x.db-shm``; a new process opens it."""
    db = tmp_path / "deleted.db"
    url = f"sqlite:///{db}?synchronous=normal"
    SQLiteStore(str(db)).close()
    ctx = mp.get_context("spawn")
    stop, readies = ctx.Event(), [ctx.Event(), ctx.Event()]
    logs = [str(tmp_path / f"W{n}.acks") for n in range(2)]
    procs = [ctx.Process(target=ack_writer, args=(url, f"W{n}", ["conv"], "deleted", 1, None,
                                                  logs[n], readies[n], stop))
             for n in range(2)]
    for proc in procs:
        proc.start()
    try:
        assert all(ready.wait(60) for ready in readies)
        _wait(lambda: all(len(read_acks(p).all_acked()) >= 50 for p in logs))
        # keep the inode the writers use countable, then delete the database: rm x.db*
        os.link(db, tmp_path / "kept.db")
        os.link(f"{db}-wal", tmp_path / "kept.db-wal")
        for suffix in ("", "-wal", "-shm"):
            os.unlink(f"{db}{suffix}")
        _mark(logs)
        _wait(lambda: all(len(read_acks(p).failed_after_mark) >= 20 for p in logs))
        # a process opening now gets a new database; the old writers never write into it
        with Memory.from_url(url) as fresh:
            assert not fresh.read("session", "conv", context=WRITERS_CONTEXT).found
            fresh.append("session", "conv", {"role": "user", "content": "new"},
                         context=WRITERS_CONTEXT)
            failed = [len(read_acks(p).failed_after_mark) for p in logs]
            _wait(lambda: all(len(read_acks(p).failed_after_mark) >= f + 20
                              for p, f in zip(logs, failed, strict=True)))
            fresh_after = fresh.read("session", "conv", context=WRITERS_CONTEXT).value
    finally:
        stop.set()
        for proc in procs:
            proc.join(60)
    assert [proc.exitcode for proc in procs] == [0, 0]
    os.rename(tmp_path / "kept.db", tmp_path / "counted.db")
    os.rename(tmp_path / "kept.db-wal", tmp_path / "counted.db-wal")
    with Memory.from_url(f"sqlite:///{tmp_path / 'counted.db'}") as counted:
        stored = counted.read("session", "conv", context=WRITERS_CONTEXT).value
    acks = [read_acks(p) for p in logs]
    acked = set().union(*(a.all_acked() for a in acks))
    result = audit(stored, batch_expected(acked))
    started_after = set().union(*(a.started_after_mark for a in acks))
    failed_after = set().union(*(a.failed_after_mark for a in acks))
    errors: Counter[str] = Counter()
    for log in acks:
        errors.update(log.errors)
    return Deletion(len(acked), result.turns, result.lost,
                    result.duplicates + result.torn + result.order_violations,
                    len(started_after), len(started_after & failed_after),
                    len(started_after - failed_after), dict(errors),
                    [m["content"] for m in fresh_after])


def _check_deletion(found: Deletion) -> None:
    assert found.lost == 0  # acknowledged and lost
    assert found.duplicates_torn_reordered == 0
    assert found.started_after >= 80
    assert found.raised_after == found.started_after  # every later append raised
    assert found.acknowledged_after == 0
    assert set(found.errors) == {"StoreUnavailable"}
    assert found.new_database == ["new"]


def test_database_deleted_under_two_writers_every_later_append_raises(tmp_path: Path,
        figure: Figure) -> None:
    found = _delete_under_two_writers(tmp_path)
    figure(f"\ndatabase deleted under 2 writers: {found}")
    _check_deletion(found)


@pytest.mark.slow
def test_database_deleted_under_two_writers_ten_times(tmp_path: Path, figure: Figure) -> None:
    rounds = [_delete_under_two_writers(tmp_path / str(n)) for n in range(10)
              if not (tmp_path / str(n)).mkdir()]
    figure(f"\ndatabase deleted under 2 writers, 10 times: acknowledged "
          f"{sum(r.acknowledged for r in rounds)}, stored {sum(r.stored_turns for r in rounds)}, "
          f"lost {sum(r.lost for r in rounds)}; after the deletion "
          f"{sum(r.started_after for r in rounds)} started, "
          f"{sum(r.raised_after for r in rounds)} raised, "
          f"{sum(r.acknowledged_after for r in rounds)} acknowledged")
    for found in rounds:
        _check_deletion(found)


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_database_replaced_while_open_the_store_refuses_from_then_on(tmp_path: Path) -> None:
    db = tmp_path / "live.db"
    context = ExecutionContext(session_id="s")
    live = Memory.from_url(f"sqlite:///{db}")
    live.append("session", "conv", _user("before"), context=context)
    with Memory.from_url(f"sqlite:///{tmp_path / 'backup.db'}") as backup:
        backup.append("session", "conv", _user("restored"), context=context)
    # restore a backup over the live file (its -wal/-shm removed, as one should)
    os.unlink(f"{db}-wal")
    os.unlink(f"{db}-shm")
    os.replace(tmp_path / "backup.db", db)
    try:
        with pytest.raises(StoreUnavailable, match="deleted or replaced"):
            live.append("session", "conv", _user("after"), context=context)
        with pytest.raises(StoreUnavailable):
            live.read("session", "conv", context=context)
        with pytest.raises(StoreUnavailable):
            live.write("session", "k", 1, context=context)
    finally:
        live.close()
    with Memory.from_url(f"sqlite:///{db}") as reopened:
        messages = reopened.read("session", "conv", context=context).value
    assert [m["content"] for m in messages] == ["restored"]


def test_main_file_deleted_a_new_open_refuses_the_leftovers(tmp_path: Path) -> None:
    db = tmp_path / "gone.db"
    key = StorageKey("global", "", "k")
    live = SQLiteStore(str(db))
    live.write(key, "v")
    os.unlink(db)  # rm gone.db, leaving gone.db-wal and gone.db-shm of a live database
    with pytest.raises(StoreUnavailable, match="deleted while open"):
        SQLiteStore(str(db))
    assert not db.exists()
    with pytest.raises(StoreUnavailable):
        live.write(key, "w")
    live.close()
    for suffix in ("-wal", "-shm"):
        os.unlink(f"{db}{suffix}")
    fresh = SQLiteStore(str(db))  # the leftovers removed: a new, empty database
    assert fresh.read(key) == (False, None)
    fresh.close()


def test_all_files_deleted_a_new_store_in_the_same_process_locks_the_new_lock_file(
        tmp_path: Path) -> None:
    db = tmp_path / "relocked.db"
    url = f"sqlite:///{db}"
    old = SQLiteStore(str(db))
    old.write(StorageKey("global", "", "k"), 1)
    for suffix in ("", "-wal", "-shm", ".lock"):  # rm relocked.db*
        os.unlink(f"{db}{suffix}")
    fresh = SQLiteStore(str(db))
    ctx = mp.get_context("spawn")
    held, release, had = ctx.Event(), ctx.Event(), ctx.Value("i", -1)
    holder = ctx.Process(target=hold_lock, args=(url, held, release, had))
    holder.start()
    try:
        assert held.wait(60) and had.value == 1
        key = StorageKey(SCOPE, resolve_scope(SCOPE, CONTEXT), KEY)
        with fresh.lock(key, 0.05) as got:  # MEM-12: the other process holds it
            assert got is False
    finally:
        release.set()
        holder.join(30)
        fresh.close()
        old.close()
    assert holder.exitcode == 0
