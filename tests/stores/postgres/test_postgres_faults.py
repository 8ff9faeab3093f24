"""PostgreSQL under faults: every wait is bounded, on both faces (issue #10, MEM-12).

- (a) a held row lock — a plain transaction holding the conversation's row
  ``FOR UPDATE``, with or without the MEM-12 advisory lock held too: the append
  returns within ``lock_timeout`` + 1 s, as the fallback with its one warning
  or as ``StoreBusy`` (on the shared server, in a throw-away schema: nothing
  is stopped there);
- (b) the server frozen (SIGSTOP): ``StoreUnavailable`` within the documented
  bound, and the store recovers by itself after SIGCONT;
- (c) ``pg_ctl restart -m fast`` under writers (and, with ``-m slow``, a
  stop, 3 s down, start): typed errors during the outage, no call past its
  bound, appends again after it, and no acknowledged append lost.

(b) and (c) run on a PRIVATE server this module starts (tests/postgres_private.py)
and removes; the shared server is never stopped, frozen or reconfigured. The
blocking face is :class:`~flowmem.Memory` over the psycopg pool, the asyncio
face :class:`~flowmem.AsyncMemory` over psycopg's async pool on an event loop
thread. Bounds are asserted with 2 s to spare; the figures are recorded (listed at the end).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from backends import unavailable
from figures import Figure
from flowmem import ExecutionContext
from flowmem.async_memory import AsyncMemory
from flowmem.errors import StoreBusy, StoreError, StoreUnavailable
from flowmem.memory import Memory
from flowmem.scopes import StorageKey
from flowmem.testing.faces import LoopThread
from postgres_private import PrivatePostgres, start
from postgres_support import admin, throwaway_schema, with_options

REASON = unavailable("postgres")
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

FACES = ("blocking", "asyncio")
# the tests on the private server run on one xdist worker: it starts the server once
ON_THE_PRIVATE_SERVER = pytest.mark.xdist_group("postgres_private")
LOCK = 1.0  # Memory(lock_timeout=...) in these tests
GRACE = 0.5  # ROW_LOCK_GRACE: the row wait left to a late or unserialized append
SPARE = 2.0  # what every asserted bound allows on top (a loaded 2-core machine)


class Face:
    """One conversation memory on the blocking or the asyncio face, called blockingly."""

    def __init__(self, face: str, url: str, lock_timeout: float = LOCK) -> None:
        self.face = face
        self._loop: LoopThread | None = None
        if face == "blocking":
            self._memory: Any = Memory.from_url(url, lock_timeout=lock_timeout)
        else:
            self._loop = LoopThread()
            self._memory = AsyncMemory.from_url(url, lock_timeout=lock_timeout)

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        result = getattr(self._memory, name)(*args, **kwargs)
        return result if self._loop is None else self._loop.run(result)

    def append(self, session: str, text: str) -> Any:
        return self._call("append", "session", "conv", {"role": "user", "content": text},
                          context=ExecutionContext(session_id=session))

    def texts(self, session: str) -> list[str]:
        page = self._call("history", "session", "conv",
                          context=ExecutionContext(session_id=session))
        return [m["content"] for m in page.messages]

    def close(self) -> None:
        if self._loop is None:
            self._memory.close()
        else:
            self._loop.run(self._memory.aclose())
            self._loop.stop()


def timed(call: Any) -> tuple[float, Any]:
    """``(seconds, result or the exception raised)``."""
    began = time.monotonic()
    try:
        result = call()
    except Exception as exc:  # the test inspects it
        result = exc
    return time.monotonic() - began, result


@pytest.fixture(scope="module")
def private() -> Iterator[PrivatePostgres]:
    server = start()
    if isinstance(server, str):
        pytest.skip(server)
    try:
        yield server
    finally:
        server.remove()


# -- (a) a held row lock -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def shared() -> Iterator[tuple[str, str]]:
    with throwaway_schema("faults") as (url, schema):
        yield with_options(url, application_name="flowmem-faults"), schema


def _hold(schema: str, session: str, *, advisory: bool) -> Any:
    """A plain transaction holding the conversation's row FOR UPDATE (and its MEM-12 lock)."""
    from flowmem.stores.postgres._common import advisory_key

    holder = admin()
    holder.execute("BEGIN")
    row = holder.execute(f'SELECT id FROM "{schema}".buffers WHERE scope = %s AND '
                         "scope_id = %s AND key = %s FOR UPDATE",
                         ("session", session, "conv")).fetchone()
    assert row is not None
    if advisory:
        holder.execute("SELECT pg_advisory_xact_lock(%s)",
                       (advisory_key(schema, StorageKey("session", session, "conv")),))
    return holder


def _release_when_waiting_for_the_row(holder: Any, seconds: float = 15) -> threading.Thread:
    """Commit the holder once the append waits for the row (i.e. after its fallback)."""
    held_by = holder.info.backend_pid

    def watch() -> None:
        with admin() as watcher:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                # waiting on THIS holder: other tests (other xdist workers) wait on theirs
                if watcher.execute("SELECT 1 FROM pg_stat_activity WHERE application_name = "
                                   "'flowmem-faults' AND wait_event_type = 'Lock' AND "
                                   "wait_event <> 'advisory' AND "
                                   "%s = ANY(pg_blocking_pids(pid))", (held_by,)).fetchone():
                    break
                time.sleep(0.01)
        holder.execute("COMMIT")

    thread = threading.Thread(target=watch)
    thread.start()
    return thread


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("advisory", [False, True], ids=["row", "row+advisory"])
def test_held_row_lock_gives_store_busy_within_lock_timeout(
        shared: tuple[str, str], face: str, advisory: bool, figure: Figure) -> None:
    """The row stays locked: the append waits at most lock_timeout + 0.5 s for its locks
    (serialized path, or the MEM-12 fallback) and raises StoreBusy; nothing stored."""
    url, schema = shared
    memory = Face(face, url)
    session = f"held-{face}-{advisory}"
    try:
        memory.append(session, "before")
        holder = _hold(schema, session, advisory=advisory)
        release = threading.Timer(15, lambda: holder.execute("ROLLBACK"))  # never hang
        release.start()
        try:
            waited, outcome = timed(lambda: memory.append(session, "blocked"))
        finally:
            release.cancel()
            holder.execute("ROLLBACK")
            holder.close()
        figure(f"\nheld row lock ({face}, {'with' if advisory else 'without'} the advisory "
              f"lock, lock_timeout {LOCK}s): {type(outcome).__name__} after {waited:.2f}s")
        assert isinstance(outcome, StoreBusy), outcome
        # StoreBusy, not the append the 15 s timer would let through: the wait was bounded
        assert memory.texts(session) == ["before"]
    finally:
        memory.close()


@pytest.mark.parametrize("face", FACES)
def test_late_mem12_lock_leaves_the_row_only_what_is_left_of_lock_timeout(
        shared: tuple[str, str], face: str, figure: Figure) -> None:
    """The advisory lock comes late (held 0.8 s of a 1 s lock_timeout) and the row stays
    locked: the row gets what is left (at least 0.5 s), not a fresh lock_timeout."""
    from flowmem.stores.postgres._common import advisory_key

    url, schema = shared
    memory = Face(face, url)
    session = f"late-{face}"
    try:
        memory.append(session, "before")
        holder = _hold(schema, session, advisory=False)
        locker = admin()
        locker.execute("BEGIN")
        locker.execute("SELECT pg_advisory_xact_lock(%s)",
                       (advisory_key(schema, StorageKey("session", session, "conv")),))
        late = threading.Timer(0.8, lambda: locker.execute("ROLLBACK"))
        late.start()
        try:
            waited, outcome = timed(lambda: memory.append(session, "blocked"))
        finally:
            late.join()
            holder.execute("ROLLBACK")
            holder.close()
            locker.close()
        figure(f"\nlate MEM-12 lock, row held ({face}): {type(outcome).__name__} after "
              f"{waited:.2f}s")
        assert isinstance(outcome, StoreBusy), outcome
        assert waited < LOCK + GRACE + SPARE
        assert memory.texts(session) == ["before"]
    finally:
        memory.close()


@pytest.mark.parametrize("face", FACES)
def test_held_row_lock_released_during_the_fallback_appends_with_one_warning(
        shared: tuple[str, str], face: str, caplog: pytest.LogCaptureFixture,
                figure: Figure) -> None:
    """Advisory lock held throughout, the row released while the fallback waits for it:
    the append runs unserialized with its one MEM-12 warning, within lock_timeout + 1 s."""
    url, schema = shared
    memory = Face(face, url)
    session = f"fallback-{face}"
    try:
        memory.append(session, "before")
        holder = _hold(schema, session, advisory=True)
        watcher = _release_when_waiting_for_the_row(holder)
        try:
            with caplog.at_level(logging.WARNING, logger="flowmem"):
                waited, outcome = timed(lambda: memory.append(session, "after the fallback"))
        finally:
            watcher.join()
            holder.close()
        warnings = [r for r in caplog.records if "MEM-12" in r.getMessage()]
        figure(f"\nheld row lock released during the fallback ({face}): serialized="
              f"{getattr(outcome, 'serialized', outcome)} after {waited:.2f}s, "
              f"{len(warnings)} warning(s)")
        assert not isinstance(outcome, Exception), outcome
        assert outcome.serialized is False and len(warnings) == 1
        assert waited < LOCK + GRACE + SPARE
        assert memory.texts(session) == ["before", "after the fallback"]
    finally:
        memory.close()


# -- (b) a frozen server ---------------------------------------------------------------------
STATEMENT = 1.0  # statement_timeout of the private server's URLs
POOL = 2.0  # pool_timeout of the private server's URLs


def _private_url(server: PrivatePostgres, schema: str) -> str:
    return with_options(server.url, schema=schema, statement_timeout=STATEMENT,
                        pool_timeout=POOL, pool_max=4)


def _recover(memory: Face, session: str, text: str, seconds: float = 60) -> tuple[float, int]:
    """Append until it works: ``(seconds it took, failed attempts)``; only typed errors."""
    began, failures = time.monotonic(), 0
    while True:
        try:
            memory.append(session, text)
            return time.monotonic() - began, failures
        except StoreError:
            failures += 1
            if time.monotonic() - began > seconds:
                raise
            time.sleep(0.2)


@ON_THE_PRIVATE_SERVER
@pytest.mark.parametrize("face", FACES)
def test_frozen_server_is_store_unavailable_within_the_bound_then_recovers(
        private: PrivatePostgres, face: str, figure: Figure) -> None:
    """SIGSTOP: the kernel still acknowledges TCP, so only the client's deadline can end
    the wait — lock wait + 0.5 s + statement_timeout + 1 s for an append in flight, then
    pool_timeout while no connection can be opened. After SIGCONT the store works again
    by itself, and what was refused was not stored."""
    memory = Face(face, _private_url(private, f"frozen_{face}"))
    session = "frozen"
    append_bound = LOCK + GRACE + STATEMENT + 1.0
    try:
        memory.append(session, "before")
        private.freeze()
        try:
            in_flight, first = timed(lambda: memory.append(session, "while frozen"))
            next_call, second = timed(lambda: memory.texts(session))
        finally:
            private.thaw()
        recovery, attempts = _recover(memory, session, "after")
        figure(f"\nSIGSTOP ({face}): append in flight -> {type(first).__name__} after "
              f"{in_flight:.2f}s (bound {append_bound:.1f}s); next call -> "
              f"{type(second).__name__} after {next_call:.2f}s (pool_timeout {POOL}s); "
              f"after SIGCONT appends again in {recovery:.2f}s ({attempts} refused)")
        assert isinstance(first, StoreUnavailable), first
        assert "did not answer" in str(first)
        assert in_flight < append_bound + SPARE
        assert isinstance(second, StoreUnavailable), second
        assert next_call < max(POOL, STATEMENT + 1.0) + SPARE
        assert memory.texts(session) == ["before", "after"]
    finally:
        private.thaw()
        memory.close()


# -- (c) a restart under writers -----------------------------------------------------------------
@ON_THE_PRIVATE_SERVER
@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("down", [0.0, pytest.param(3.0, marks=pytest.mark.slow)],
                         ids=["restart", "down-3s"])
def test_restart_under_writers_loses_no_acknowledged_append(
        private: PrivatePostgres, face: str, down: float, figure: Figure) -> None:
    """pg_ctl restart -m fast (or stop -m fast, 3 s down, start) under 4 writers on 2
    conversations: the outage gives typed errors only, no call waits past pool_timeout
    (+ 2 s), writes resume by themselves, and every acknowledged append is stored."""
    memory = Face(face, _private_url(private, f"restart_{face}_{int(down)}"))
    acked: dict[str, set[str]] = {"c0": set(), "c1": set()}
    errors: Counter[str] = Counter()
    unknown = 0  # errors that say the append may or may not have been stored
    untyped: list[BaseException] = []
    after_restart = threading.Event()
    acked_after = 0
    longest = 0.0  # the longest single call
    stop = threading.Event()
    guard = threading.Lock()

    def writer(w: int) -> None:
        nonlocal unknown, acked_after, longest
        session, i = f"c{w % 2}", 0
        while not stop.is_set():
            text = f"w{w}:{i}"
            i += 1
            began = time.monotonic()
            try:
                memory.append(session, text)
            except StoreError as exc:
                with guard:
                    longest = max(longest, time.monotonic() - began)
                    errors[type(exc).__name__] += 1
                    unknown += "may or may not" in str(exc)
                time.sleep(0.05)
                continue
            except BaseException as exc:
                untyped.append(exc)
                return
            with guard:
                longest = max(longest, time.monotonic() - began)
                acked[session].add(text)
                acked_after += after_restart.is_set()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    try:
        for thread in threads:
            thread.start()
        time.sleep(1.5)
        began = time.monotonic()
        if down:
            private.outage(down)
        else:
            private.restart()
        outage = time.monotonic() - began
        after_restart.set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (acked_after < 50 or time.monotonic() - began < 4):
            time.sleep(0.1)
        stop.set()
        for thread in threads:
            thread.join(30)
            assert not thread.is_alive(), "a writer hung"
        stored = {session: set(memory.texts(session)) for session in acked}
        n_acked = sum(len(texts) for texts in acked.values())
        n_stored = sum(len(texts) for texts in stored.values())
        lost = sum(len(acked[s] - stored[s]) for s in acked)
        figure(f"\n{'restart -m fast' if not down else f'{down:.0f}s down'} ({face}): outage "
              f"{outage:.2f}s; {n_acked} acknowledged, {n_stored} stored, {lost} lost; errors "
              f"{dict(errors)} ({unknown} with an unknown outcome); longest call "
              f"{longest:.2f}s; {acked_after} acknowledged after the restart")
        assert untyped == []
        assert lost == 0
        assert n_stored - n_acked <= unknown  # only an unknown outcome may have been stored
        assert acked_after > 0
        assert longest < POOL + LOCK + GRACE + STATEMENT + 1.0 + SPARE
    finally:
        stop.set()
        memory.close()


# -- the defaults and their URL overrides ---------------------------------------------------------
@pytest.mark.parametrize("face", FACES)
def test_tcp_keepalives_and_user_timeout_are_set_on_pooled_connections(
        shared: tuple[str, str], face: str) -> None:
    """libpq parameters flowmem adds unless the URL gives them, seen on the real socket."""
    import socket

    url, _ = shared
    overridden = with_options(url, keepalives_idle=7, connect_timeout=4)
    loop = LoopThread() if face == "asyncio" else None
    if loop is None:
        from flowmem.stores import open_store

        store: Any = open_store(overridden)
        store.read(StorageKey("session", "s", "opened"))  # the pool opens on first use
    else:
        from flowmem.stores import open_async_store

        store = open_async_store(overridden)
        loop.run(store.read(StorageKey("session", "s", "opened")))

    def options(conn: Any) -> tuple[dict[str, str], int, int, int]:
        info = {o.keyword.decode(): (o.val or b"").decode() for o in conn.pgconn.info}
        sock = socket.socket(fileno=conn.pgconn.socket)
        try:
            return (info, sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                    sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                    sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT))
        finally:
            sock.detach()

    async def async_options() -> tuple[dict[str, str], int, int, int]:
        async with store._pool.connection() as conn:
            return options(conn)

    try:
        if loop is None:
            with store._pool.connection() as conn:
                info, keepalive, idle, user_timeout = options(conn)
        else:
            info, keepalive, idle, user_timeout = loop.run(async_options())
        assert (info["connect_timeout"], info["keepalives"], info["keepalives_idle"],
                info["keepalives_interval"], info["keepalives_count"],
                info["tcp_user_timeout"]) == ("4", "1", "7", "2", "3", "10000")
        assert (keepalive, idle, user_timeout) == (1, 7, 10000)
    finally:
        if loop is None:
            store.close()
        else:
            loop.run(store.aclose())
            loop.stop()


@pytest.mark.parametrize("face", FACES)
def test_statement_timeout_bounds_a_slow_statement(shared: tuple[str, str], face: str,
        figure: Figure) -> None:
    """A statement the server takes too long over (a trigger sleeping 3 s) is cut by the
    URL's statement_timeout: StoreUnavailable, and nothing of the append is stored."""
    url, schema = shared
    memory = Face(face, with_options(url, statement_timeout=0.5))
    session = f"slow-{face}"
    with admin() as conn:
        conn.execute(f"""
            CREATE OR REPLACE FUNCTION "{schema}".slow() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.body LIKE '%%slow%%' THEN PERFORM pg_sleep(3); END IF;
                RETURN NEW;
            END $$;
            CREATE OR REPLACE TRIGGER slow BEFORE INSERT ON "{schema}".messages
                FOR EACH ROW EXECUTE FUNCTION "{schema}".slow();
        """)
    try:
        memory.append(session, "fast")
        waited, outcome = timed(lambda: memory.append(session, "slow"))
        figure(f"\nstatement_timeout=0.5 ({face}): {type(outcome).__name__} after {waited:.2f}s")
        assert isinstance(outcome, StoreUnavailable), outcome
        assert "statement_timeout" in str(outcome)  # the server's bound fired, not a hang
        assert memory.texts(session) == ["fast"]
    finally:
        with admin() as conn:
            conn.execute(f'DROP TRIGGER slow ON "{schema}".messages; '
                         f'DROP FUNCTION "{schema}".slow()')
        memory.close()


@ON_THE_PRIVATE_SERVER
@pytest.mark.parametrize("face", FACES)
def test_frozen_server_each_call_is_bounded_with_a_warm_pool(
        private: PrivatePostgres, face: str, figure: Figure) -> None:
    """SIGSTOP with four idle pooled connections opened before it: once the first call's
    deadline fires, the pool's older connections are dropped unused, so each of the next
    calls fails within pool_timeout (not one more deadline per idle connection).

    A deadline here (statement_timeout 4 s + 1 s and more) is longer than pool_timeout
    (1 s) with its margin, so a call that paid one more deadline fails the bound."""
    statement, pool_timeout = 4.0, 1.0
    url = with_options(_private_url(private, f"warm_{face}"), pool_min=4,
                       statement_timeout=statement, pool_timeout=pool_timeout)
    memory = Face(face, url)
    session = "warm"
    append_bound = LOCK + GRACE + statement + 1.0
    assert statement + 1.0 > pool_timeout + SPARE
    try:
        memory.append(session, "before")
        pool = memory._memory.store._pool
        deadline = time.monotonic() + 30
        while pool.get_stats().get("pool_available", 0) < 4:  # four idle, opened before
            assert time.monotonic() < deadline, pool.get_stats()
            time.sleep(0.01)
        private.freeze()
        durations: list[float] = []
        try:
            for n in range(8):
                call = ((lambda n=n: memory.append(session, f"frozen {n}")) if n % 2 == 0
                        else (lambda: memory.texts(session)))
                took, outcome = timed(call)
                durations.append(took)
                assert isinstance(outcome, StoreUnavailable), outcome
                bound = append_bound if n == 0 else pool_timeout
                assert took < bound + SPARE, (n, durations)
        finally:
            private.thaw()
        figure(f"\nSIGSTOP with a warm pool ({face}): 8 calls took "
              f"{', '.join(f'{d:.2f}' for d in durations)} s (bounds {append_bound:.1f} s, "
              f"then pool_timeout {pool_timeout} s)")
        _recover(memory, session, "after")
        assert memory.texts(session) == ["before", "after"]
    finally:
        private.thaw()
        memory.close()
