"""The two drivers of the Redis programs: blocking on ``redis.Redis``, asyncio on ``redis.asyncio``.

A driver is the only place that does I/O. It runs a program
(:mod:`flowmem.stores.redis._programs`) to completion: each :class:`Pipe` is
sent as one round trip (a single command directly, several as a pipeline,
``MULTI``/``EXEC`` when asked) with ``raise_on_error=False`` semantics —
a command's server error comes back as a flowmem error *value* — and each
:class:`Sleep` is ``time.sleep`` or ``asyncio.sleep``. A request that fails
as a whole (connection lost or timed out, the caller cancelled) is thrown
into the program, mapped to flowmem's errors, so the program can release
what it holds before the error leaves it.

Also here: the clients a store URL names (both faces read the same URL
options), and the renewers that keep a ``lock()`` holder's lease alive — a
daemon thread on the blocking face, a task on the asyncio face.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from types import ModuleType
from typing import Any, Final

from ...errors import (
    InvalidStoreURL,
    MissingDependency,
    OutcomeUnknown,
    StoreError,
    StoreUnavailable,
)
from ...scopes import StorageKey
from ._keys import Names
from ._pinned import asend_pinned, send_pinned
from ._programs import NoScript, Pipe, Program, Request, Sleep, T
from ._requests import Scan, changes, waited

__all__ = ["AsyncGates", "Driver", "Renewer", "adrive", "drive", "import_redis", "one_line",
           "peeking", "renew_task"]


def import_redis() -> ModuleType:
    """redis-py, or :class:`~flowmem.errors.MissingDependency` naming the extra."""
    try:
        import redis
    except ImportError as exc:
        raise MissingDependency("redis", "redis") from exc
    return redis


def one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def peeking(cls: Any) -> Any:
    """``cls`` (a ``redis.asyncio`` connection class) whose pooled connections notice
    when the server has closed them, before a command is sent on them.

    The pool checks a connection before reusing it, but on asyncio it sees an
    end of stream only once the event loop has read it (and redis-py 8 skips
    the check altogether while maintenance notifications are ``auto``): after
    a server restart the loop has not noticed yet, the next command would be
    sent on a dead connection. A read can be retried then; an append is one
    script that cannot be (it may have run), so the pool must not hand such a
    connection out. One ``poll`` for the peer's hang-up settles it (Linux's
    ``POLLRDHUP``; elsewhere the check is redis-py's alone).
    """

    class Peeking(cls):  # type: ignore[misc]
        async def can_read(self) -> bool:
            if _hung_up(self):
                from redis.exceptions import ConnectionError as Lost

                raise Lost("Connection closed by server.")  # the pool reconnects
            return bool(await super().can_read())

    Peeking.__name__ = Peeking.__qualname__ = f"Peeking{cls.__name__}"
    return Peeking


_HUNG_UP: Final = getattr(select, "POLLRDHUP", 0)


def _hung_up(connection: Any) -> bool:
    """Whether the server closed an idle connection (without the event loop reading it)."""
    transport = getattr(getattr(connection, "_writer", None), "transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or not _HUNG_UP:
        return False
    poller = select.poll()
    try:
        poller.register(sock.fileno(), _HUNG_UP)
        return any(events & (_HUNG_UP | select.POLLHUP | select.POLLERR)
                   for _, events in poller.poll(0))
    except (OSError, ValueError):
        return False


class Driver:
    """Runs requests on one client; maps redis-py's exceptions to flowmem's.

    ``timeout``: on the asyncio face, the bound of one round trip (else redis-py's
    own socket timeouts apply).
    """

    def __init__(self, client: Any, timeout: float | None = None) -> None:
        redis = import_redis()
        self.timeout = timeout
        # redis-py types replies as ``bytes | str`` unions (decode_responses decides);
        # the stores always read raw bytes, so the client is handled untyped
        self.client: Any = client
        ex = redis.exceptions
        self._lost: tuple[type[BaseException], ...] = (
            ex.ConnectionError, ex.TimeoutError, OSError)
        # a cluster's passing states (a failover, a slot moving): the command did not run
        # (MOVED: a pinned pipe's redirections ran out, _pinned.py)
        self._away: tuple[type[BaseException], ...] = (
            ex.ClusterDownError, ex.TryAgainError, ex.AskError, ex.ReadOnlyError,
            ex.SlotNotCoveredError, ex.MovedError)
        self._cluster: type[BaseException] = ex.RedisClusterException
        self._moved: type[BaseException] = ex.MovedError
        self.cluster = isinstance(client, (redis.RedisCluster, redis.asyncio.RedisCluster))
        self._failed: type[BaseException] = ex.RedisError
        self._noscript: type[BaseException] = ex.NoScriptError

    def mapped(self, exc: BaseException, what: str,
               request: Request | None = None) -> BaseException:
        """flowmem's error for ``exc``; anything not from redis-py (a cancellation) as is.

        ``request``: what was sent; a lost answer to a script that changes data is
        :class:`~flowmem.errors.OutcomeUnknown` (the script may have run)."""
        if isinstance(exc, StoreError | InvalidStoreURL):
            return exc
        if isinstance(exc, self._noscript):
            error: Exception = NoScript(f"Redis error during {what}: {exc}")
        elif (isinstance(exc, self._lost) and request is not None and changes(request)
              and "connecting to" not in str(exc)):
            error = OutcomeUnknown(f"Redis connection lost during {what} after the change was "
                                   f"sent; it may or may not have been stored: retry with the "
                                   f"same idempotency key (it is then stored once): "
                                   f"{one_line(exc)}")
        elif isinstance(exc, self._lost):
            error = StoreUnavailable(f"Redis connection lost during {what}: {one_line(exc)}")
        elif isinstance(exc, self._moved) and not self.cluster:
            error = StoreError(f"Redis answered MOVED during {what}: the server is a Redis "
                               "Cluster node; drop ?cluster=no from the URL")
        elif "SELECT is not allowed in cluster mode" in str(exc):
            error = InvalidStoreURL("the server is a Redis Cluster node, which has only "
                                    "database 0: use /0 in the URL")
        elif isinstance(exc, self._away) or (
                isinstance(exc, self._cluster) and "cannot be connected" in str(exc)):
            error = StoreUnavailable(f"Redis Cluster unavailable during {what} "
                                     f"(nothing was changed; retry): {one_line(exc)}")
        elif isinstance(exc, (self._failed, self._cluster)):
            error = StoreError(f"Redis error during {what}: {one_line(exc)}")
        else:
            return exc
        error.__cause__ = exc
        return error

    def replies(self, raw: list[Any], what: str, request: Request) -> list[Any]:
        """``raw`` with each error value mapped (a lost connection in a cluster pipeline
        is a value too: after a script that changes data, the outcome is unknown)."""
        return [self.mapped(r, what, request) if isinstance(r, BaseException) else r
                for r in raw]

    # -- blocking ----------------------------------------------------------------------
    def execute(self, request: Request, what: str) -> Any:
        if isinstance(request, Sleep):
            time.sleep(request.seconds)
            return None
        if isinstance(request, Scan):
            return list(self.client.scan_iter(match=request.match, count=request.count))
        return self.replies(self._send(request), what, request)

    def _send(self, request: Pipe) -> list[Any]:
        if request.pin is not None and self.cluster:
            return send_pinned(self.client, request)
        if len(request.commands) == 1 and not request.transaction:
            try:
                return [self.client.execute_command(*request.commands[0])]
            except (self._failed, self._cluster) as exc:
                if isinstance(exc, self._lost):
                    raise
                return [exc]
        pipe = self.client.pipeline(transaction=request.transaction)
        for command in request.commands:
            pipe.execute_command(*command)
        return list(pipe.execute(raise_on_error=False))

    # -- asyncio -----------------------------------------------------------------------
    async def aexecute(self, request: Request, what: str) -> Any:
        if isinstance(request, Sleep):
            await asyncio.sleep(request.seconds)
            return None
        if isinstance(request, Scan):
            return [name async for name in self.client.scan_iter(match=request.match,
                                                                 count=request.count)]
        # a WAIT may hold the reply back up to its own timeout
        bound = None if self.timeout is None else self.timeout + waited(request)
        try:
            async with asyncio.timeout(bound):
                return self.replies(await self._asend(request), what, request)
        except TimeoutError as exc:
            if changes(request):
                raise OutcomeUnknown(f"Redis timed out during {what} (no reply within "
                                     f"{bound} s) after the change was sent; it may or "
                                     f"may not have been stored: retry with the same "
                                     f"idempotency key (it is then stored once)") from exc
            raise StoreUnavailable(f"Redis timed out during {what} "
                                   f"(no reply within {bound} s)") from exc

    async def _asend(self, request: Pipe) -> list[Any]:
        if request.pin is not None and self.cluster:
            return await asend_pinned(self.client, request)
        if len(request.commands) == 1 and not request.transaction:
            try:
                return [await self.client.execute_command(*request.commands[0])]
            except (self._failed, self._cluster) as exc:
                if isinstance(exc, self._lost):
                    raise
                return [exc]
        pipe = self.client.pipeline(transaction=request.transaction)
        for command in request.commands:
            pipe.execute_command(*command)
        return list(await pipe.execute(raise_on_error=False))


def drive(program: Program[T], driver: Driver, what: str) -> T:
    """Run ``program`` to completion on a blocking client."""
    try:
        request = next(program)
        while True:
            try:
                reply = driver.execute(request, what)
            except BaseException as exc:  # thrown into the program
                request = program.throw(driver.mapped(exc, what, request))
            else:
                request = program.send(reply)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    finally:
        program.close()


async def adrive(program: Program[T], driver: Driver, what: str) -> T:
    """Run ``program`` to completion on an asyncio client (cancellation is thrown in too)."""
    try:
        request = next(program)
        while True:
            try:
                reply = await driver.aexecute(request, what)
            except BaseException as exc:  # thrown into the program
                request = program.throw(driver.mapped(exc, what, request))
            else:
                request = program.send(reply)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    finally:
        program.close()


class Renewer:
    """One daemon thread per store renewing every held ``lock()`` lease each ``period`` s.

    A lease is added when a ``lock()`` block starts and discarded when it ends;
    all renewals go in one round trip. The thread starts with the first lease
    (again after a fork) and ends when none is left.
    """

    def __init__(self, renew: Callable[[list[tuple[Names, str]]], object],
                 period: float) -> None:
        self._renew = renew
        self._period = period
        self._held: dict[str, Names] = {}
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, names: Names, token: str) -> None:
        with self._mutex:
            self._held[token] = names
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="flowmem-redis-lease",
                                                daemon=True)
                self._thread.start()

    def discard(self, token: str) -> None:
        with self._mutex:
            self._held.pop(token, None)

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            with self._mutex:
                held = [(names, token) for token, names in self._held.items()]
                if not held:
                    self._thread = None
                    return
            # the server is away: a lease may lapse; the version check still holds
            with contextlib.suppress(StoreError):
                self._renew(held)

    def close(self) -> None:
        self._stop.set()
        with self._mutex:
            thread = self._thread
        if thread is not None:
            thread.join()


def renew_task(renew: Callable[[], Awaitable[object]], period: float) -> asyncio.Task[None]:
    """The asyncio twin of :class:`Renewer`: cancel the task to stop it."""

    async def run() -> None:
        while True:
            await asyncio.sleep(period)
            with contextlib.suppress(StoreError):
                await renew()

    return asyncio.get_running_loop().create_task(run(), name="flowmem-redis-lease")


class AsyncGates:
    """Per-conversation queues of one asyncio store, in front of the MEM-12 lease.

    The tasks of one store appending to one conversation wait on an
    :class:`asyncio.Lock` (woken the moment the previous one finishes) instead
    of all polling the lease in Redis; only the gate's holder takes the lease,
    which still serializes them with every other process. The wait for the
    gate counts against the same ``lock_timeout``. (The blocking store does
    the same with :class:`~flowmem.stores._locks.KeyLocks`.)
    """

    def __init__(self) -> None:
        self._gates: dict[StorageKey, tuple[asyncio.Lock, list[int]]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: StorageKey, timeout: float) -> AsyncIterator[bool]:
        """Yields whether the gate was had within ``timeout`` seconds."""
        gate, users = self._gates.setdefault(key, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            try:
                async with asyncio.timeout(max(timeout, 0.0)):
                    await gate.acquire()
                had = True
            except TimeoutError:
                had = False
            try:
                yield had
            finally:
                if had:
                    gate.release()
        finally:
            users[0] -= 1
            if not users[0]:
                del self._gates[key]
