"""The Redis store's logic as sans-I/O programs, shared by the sync and asyncio faces.

Every store operation is a *program*: a generator that yields I/O requests
and receives their replies (as :mod:`flowmem.stores.sql` does for SQL):

:class:`Pipe`
    commands sent in one round trip (``MULTI``/``EXEC`` when ``transaction``);
    the reply is the list of their replies, where a command's server error is
    a :class:`~flowmem.errors.StoreError` *value* (redis-py's
    ``raise_on_error=False``) — :class:`NoScript` for an unknown script.
:class:`Sleep`
    a pause (the bounded MEM-12 wait's backoff); the reply is ``None``.

A driver (:mod:`flowmem.stores.redis_drivers`) runs a program on
``redis.Redis`` or on ``redis.asyncio.Redis``. When a request fails as a
whole — the connection is lost, the caller is cancelled — the driver *throws*
the (mapped) exception into the program at its ``yield``, so the program's
own ``try``/``finally`` can still release the MEM-12 lease it may hold.

Locks are leases (MEM-12, see :mod:`flowmem.stores.redis`): a random token
set for ``lease_ms`` when the key is free (``SET NX PX``), extended
only by its holder (:data:`~flowmem.stores.redis_scripts.RENEW`: an append in
its own round trips, a ``lock()`` holder from the driver's renewer) and
released by compare-and-delete — so a dead holder's lease lapses by itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import time
import uuid
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, TypeVar

from ..entries import edit_entries
from ..errors import IdempotencyConflict, KeyConflict, StoreError, StoreUnavailable
from ..messages import Message
from ..plan import SLOT, AppendPlan, BufferView, mentioned_ids, needs_pending, plan_append
from ..scopes import StorageKey
from ..store import AppendOutcome, AppendStats, HistoryPage, Idempotency
from . import redis_scripts as lua
from .redis_layout import Names, key_names, plan_args, rewrite, view_from
from .sql import decode, encode

__all__ = ["NoScript", "Pipe", "Program", "RedisPrograms", "Request", "Sleep", "T"]

T = TypeVar("T")
POLL_START: Final = 0.0002
POLL_MAX: Final = 0.002
EDIT_LOCK_WAIT: Final = 30.0
SCRIPTS: Final = (lua.APPLY, lua.READ, lua.HISTORY, lua.WRITE, lua.DELETE, lua.EDIT,
                  lua.RELEASE)
SHAS: Final = {src: hashlib.sha1(src.encode()).hexdigest() for src in SCRIPTS}
Command = tuple[Any, ...]


class NoScript(StoreError):
    """The server does not know a script (flushed or restarted): load it and retry."""


@dataclass(frozen=True, slots=True)
class Pipe:
    """Commands in one round trip; ``MULTI``/``EXEC`` when ``transaction``."""

    commands: tuple[Command, ...]
    transaction: bool = False


@dataclass(frozen=True, slots=True)
class Sleep:
    """Pause ``seconds`` (never blocking an event loop on the asyncio face)."""

    seconds: float


Request = Pipe | Sleep
Program = Generator[Request, Any, T]
"""A Redis program: yields :data:`Request` s, receives their replies, returns ``T``."""


@dataclass(frozen=True, slots=True)
class _Snapshot:
    view: BufferView
    version: str


def _first_error(replies: Sequence[Any]) -> None:
    for reply in replies:
        if isinstance(reply, StoreError):
            raise reply


def _held(reply: Any) -> bool:
    """``SET NX`` replies ``True``/``OK`` when it took the lease, ``RENEW`` ``1`` when it
    extended it; anything else (``None``, ``0``) means another token holds it."""
    return reply is True or reply == 1 or reply == b"OK"


def _conflict(names: Names) -> KeyConflict:
    key = names.member.decode("utf-8", "surrogatepass")
    return KeyConflict(f"key {key!r} holds a plain value, not a conversation")


def _idem_conflict(idempotency: Idempotency | None) -> IdempotencyConflict:
    key = idempotency.key if idempotency is not None else ""
    return IdempotencyConflict(f"idempotency key {key!r} was used for a different request; "
                               "a retry must repeat it exactly")


def retried(make: Callable[[], Program[T]]) -> Program[T]:
    """Run a read-only (or repeatable) program, again once if the connection dropped."""
    try:
        return (yield from make())
    except StoreUnavailable:
        return (yield from make())


def load(src: str) -> Program[None]:
    """``SCRIPT LOAD`` one script (Redis 7.0+: the scripts carry flags)."""
    reply = (yield Pipe((("SCRIPT", "LOAD", src),)))[0]
    if isinstance(reply, StoreError):
        raise StoreError(f"cannot load flowmem's Lua scripts (Redis 7.0+ needed): {reply}")


def setup() -> Program[None]:
    """Load every script: the first round trip of a store (fails fast when unreachable)."""
    for src in SCRIPTS:
        yield from load(src)


def script(src: str, keys: Sequence[bytes], args: Sequence[Any],
           extra: tuple[Command, ...] = ()) -> Program[Any]:
    """``EVALSHA`` (+ ``extra`` commands in the same round trip), loading it once on NOSCRIPT."""
    command = ("EVALSHA", SHAS[src], len(keys), *keys, *args)
    for attempt in (0, 1):
        replies = yield Pipe((command, *extra))
        if attempt == 0 and isinstance(replies[0], NoScript):
            yield from load(src)
            continue
        _first_error(replies)
        return replies[0]
    raise AssertionError("unreachable")


class RedisPrograms:
    """The programs of every store operation for one key prefix and lease length."""

    def __init__(self, prefix: bytes, lease_ms: int) -> None:
        self.prefix = prefix
        self.lease_ms = lease_ms

    def names(self, key: StorageKey) -> Names:
        return key_names(self.prefix, key)

    @staticmethod
    def new_token() -> str:
        """A lease token (or a version): random, never reused."""
        return uuid.uuid4().hex

    # -- values -------------------------------------------------------------------
    def read(self, key: StorageKey) -> Program[tuple[bool, Any]]:
        names = self.names(key)
        reply = yield from retried(lambda: script(lua.READ, names.keys, ()))
        if reply[0] == b"v":
            return True, decode(reply[1].decode())
        if reply[0] == b"b":
            return True, [decode(body.decode()) for body in reply[1:]]
        return False, None

    def idempotency_key(self, idempotency: Idempotency) -> bytes:
        """Where an idempotency record lives (one key per idempotency key, with a TTL)."""
        return self.prefix + b":idem:" + idempotency.key.encode("utf-8", "surrogatepass")

    def _idem(self, idempotency: Idempotency) -> tuple[bytes, tuple[str, int, str]]:
        """The record's key and the scripts' arguments: fingerprint, TTL (ms), the clock."""
        ttl_ms = max(1, int(idempotency.ttl * 1000))
        return (self.idempotency_key(idempotency),
                (idempotency.fingerprint, ttl_ms, repr(float(idempotency.now))))

    def write(self, key: StorageKey, value: Any,
              idempotency: Idempotency | None = None) -> Program[None]:
        names = self.names(key)
        keys: tuple[bytes, ...] = names.keys
        args: tuple[Any, ...] = (encode(value),)
        if idempotency is not None:
            record, extra = self._idem(idempotency)
            keys, args = (*keys, record), (*args, *extra)
        reply = yield from script(lua.WRITE, keys, args, (("ZADD", names.index, 0, names.member),))
        if reply == b"idem_conflict":
            raise _idem_conflict(idempotency)

    def delete(self, key: StorageKey, idempotency: Idempotency | None = None) -> Program[bool]:
        names = self.names(key)
        if idempotency is not None:
            record, extra = self._idem(idempotency)
            reply = yield from script(lua.DELETE, (*names.keys, record), extra,
                                      (("ZREM", names.index, names.member),))
            if reply[0] == b"idem_conflict":
                raise _idem_conflict(idempotency)
            found = bool(int(reply[1]))
            replies = yield Pipe((("EXISTS", names.value, names.meta),))
        else:
            replies = yield Pipe((("DEL", *names.keys[:-1]),  # all but the lock, one atomic DEL
                                  ("ZREM", names.index, names.member),
                                  ("EXISTS", names.value, names.meta)))
            found = bool(replies[0])
        _first_error(replies)
        if replies[-1]:  # re-created by a concurrent writer after our DEL: keep it listed
            _first_error((yield Pipe((("ZADD", names.index, 0, names.member),))))
        return found

    def history(self, key: StorageKey, last: int | None,
                before: int | None) -> Program[HistoryPage]:
        names = self.names(key)
        args = ("" if last is None else last, "" if before is None else before)
        reply = yield from retried(lambda: script(lua.HISTORY, names.keys, args))
        if reply[0] == b"value":
            raise _conflict(names)
        positions = [int(p) for p in reply[2::2]]
        messages = [decode(body.decode()) for body in reply[3::2]]
        more = bool(reply[0]) and bool(positions)
        return HistoryPage(messages, positions, positions[0] if more else None, int(reply[1]))

    def keys(self, scope: str, scope_id: str, prefix: str, after: str | None,
             limit: int) -> Program[list[str]]:
        start = prefix.encode("utf-8", "surrogatepass")
        upper = b"(" + start + b"\xff" if start else b"+"
        low = b"[" + start
        if after is not None and after.encode("utf-8", "surrogatepass") >= start:
            low = b"(" + after.encode("utf-8", "surrogatepass")
        index = self.names(StorageKey(scope, scope_id, "")).index
        found: list[str] = []
        while len(found) < limit:
            want = limit - len(found)
            batch = (yield Pipe((("ZRANGEBYLEX", index, low, upper, "LIMIT", 0, want),)))[0]
            _first_error([batch])
            if not batch:
                break
            members = [m.decode("utf-8", "surrogatepass") for m in batch]
            checks = tuple(("EXISTS", *self.names(StorageKey(scope, scope_id, m)).keys[:2])
                           for m in members)  # an index entry can outlive its key a moment
            live = yield Pipe(checks)
            _first_error(live)
            found += [m for m, alive in zip(members, live, strict=True) if alive]
            if len(batch) < want:
                break
            low = b"(" + batch[-1]
        return found

    # -- appends --------------------------------------------------------------------
    def append(self, key: StorageKey, incoming: Sequence[Message], max_messages: int | None,
               lock_timeout: float,
               idempotency: Idempotency | None = None) -> Program[AppendOutcome]:
        """Snapshot (+ lease) → plan → ``APPLY`` (checks the version, releases the lease).

        On a version conflict it reads and plans again, renewing its lease in
        each read. Whatever ends it early (an error, a cancellation thrown in
        by the driver), it releases the lease it may hold before re-raising.
        """
        names = self.names(key)
        ids = sorted(mentioned_ids(incoming))
        heals = needs_pending(incoming)
        token = self.new_token()
        deadline = time.monotonic() + max(lock_timeout, 0.0)
        lease: str | None = token  # the lease may be ours until the script released it
        try:
            held, snap = yield from retried(lambda: self._snapshot(names, ids, heals, token))
            serialized = held
            if not held:
                serialized = held = yield from self.wait(names, token, deadline)
                if held:
                    snap = (yield from retried(
                        lambda: self._snapshot(names, ids, heals, None)))[1]
            conflicts = 0
            while True:
                plan = plan_append(snap.view, incoming)
                done = yield from self._apply(names, snap.version, plan, max_messages,
                                              token if held else "", idempotency)
                if done is not None:
                    lease = None  # the script released it
                    count, appended, owned, replayed = done
                    # fenced: serialized only if the lease was still this token's
                    if replayed:
                        return AppendOutcome(count, appended, serialized and owned,
                                             replayed=True)
                    stats = AppendStats(plan.dropped_results, plan.dropped_turns, plan.healed,
                                        plan.replaced)
                    return AppendOutcome(count, appended, serialized and owned, stats)
                conflicts += 1
                if time.monotonic() >= deadline:
                    serialized = False  # MEM-12: still never dropped, still whole
                if conflicts > 2:
                    yield Sleep(random.uniform(0, min(POLL_MAX, POLL_START * conflicts)))
                still, snap = yield from retried(
                    partial(self._snapshot, names, ids, heals, token if held else None, True))
                if held and not still:
                    held = serialized = False  # the lease lapsed and someone took it
        except GeneratorExit:
            raise
        except BaseException:
            if lease is not None:
                yield from self.release(names, lease)
            raise

    def _snapshot(self, names: Names, ids: list[str], heals: bool, lease: str | None,
                  renew: bool = False) -> Program[tuple[bool, _Snapshot]]:
        """The planner's view and the version in one MULTI; maybe take (or renew) the lease."""
        commands: list[Command] = []
        if lease is not None:
            commands.append(self._lease(names, lease, renew=renew))
        commands += [("EXISTS", names.value), ("HGET", names.meta, "ver")]
        if ids:
            commands += [("HMGET", names.res, *ids), ("HMGET", names.calls, *ids)]
        if heals:
            commands.append(("HGETALL", names.pend))
        replies = list((yield Pipe(tuple(commands), transaction=True)))
        _first_error(replies)
        held = lease is not None and _held(replies.pop(0))
        if replies.pop(0):
            raise _conflict(names)
        version = (replies.pop(0) or b"").decode()
        return held, _Snapshot(view_from(ids, heals, replies), version)

    def _apply(self, names: Names, version: str, plan: AppendPlan, max_messages: int | None,
               lease: str, idempotency: Idempotency | None = None,
               ) -> Program[tuple[int, int, bool, bool] | None]:
        """``(count, appended, lease still ours, replayed)``, or ``None`` on a version
        conflict. An idempotency key is checked and recorded by the script itself."""
        keys: tuple[bytes, ...] = names.keys
        idem: tuple[Any, ...] = ("", 0, "0")
        if idempotency is not None:
            record, idem = self._idem(idempotency)
            keys = (*keys, record)
        args = [version, uuid.uuid4().hex, lease, SLOT,
                "" if max_messages is None else max_messages, *idem, *plan_args(plan)]
        # an append that may create the buffer lists its key in the same round trip
        extra = () if version else (("ZADD", names.index, 0, names.member),)
        reply = yield from script(lua.APPLY, keys, args, extra)
        if reply[0] == b"value":
            raise _conflict(names)
        if reply[0] == b"conflict":
            return None
        if reply[0] == b"idem_conflict":
            raise _idem_conflict(idempotency)
        return int(reply[1]), int(reply[2]), bool(int(reply[3])), reply[0] == b"replay"

    # -- the administrative path (MEM-15) ------------------------------------------------
    def edit(self, key: StorageKey, position: int, message: Message | None) -> Program[bool]:
        """Under the lease: read entries + version in one MULTI, edit and re-derive in
        Python, write back with the version-checked ``EDIT`` script (again on conflict)."""
        names = self.names(key)
        token = self.new_token()
        held = yield from self.acquire(names, token, EDIT_LOCK_WAIT)
        try:
            done = yield from self._edit(names, token if held else None, position, message)
        except GeneratorExit:
            raise
        except BaseException:
            if held:
                yield from self.release(names, token)
            raise
        if held:
            yield from self.release(names, token)
        return done

    def _edit(self, names: Names, lease: str | None, position: int,
              message: Message | None) -> Program[bool]:
        while True:
            replies = yield from retried(lambda: self._entries(names, lease))
            if replies is None:
                return False
            version, entries = replies
            edited = edit_entries(entries, position, message)
            if edited is None:
                return False
            done = yield from script(lua.EDIT, names.keys, self._edit_args(version, edited))
            if done != b"conflict":  # 'value': a plain value replaced it meanwhile
                return bool(done == b"ok")

    def _entries(self, names: Names, lease: str | None,
                 ) -> Program[tuple[str, list[tuple[int, Message]]] | None]:
        commands: tuple[Command, ...] = (
            ("EXISTS", names.value), ("HGET", names.meta, "ver"),
            ("ZRANGE", names.pos, 0, -1), ("HGETALL", names.body))
        if lease is not None:
            commands += (self._lease(names, lease, renew=True),)  # the edit's reads renew it
        replies = yield Pipe(commands, transaction=True)
        _first_error(replies)
        exists, version, stored, bodies = replies[:4]
        if exists or version is None:
            return None
        return version.decode(), [(int(p), decode(bodies[p].decode())) for p in stored]

    @staticmethod
    def _edit_args(version: str, edited: list[tuple[int, Message]]) -> list[Any]:
        keys = rewrite(edited)
        args: list[Any] = [version, uuid.uuid4().hex, len(edited), len(keys.pos), *keys.pos]
        for mapping in (keys.body, keys.info, keys.res, keys.calls, keys.pend):
            args.append(len(mapping))
            for field, value in mapping.items():
                args += [field, value]
        return args

    # -- MEM-12 leases --------------------------------------------------------------------
    def _lease(self, names: Names, token: str, *, renew: bool = False) -> Command:
        """Take the lease when free (``SET NX PX``: a fresh token never holds it yet), or
        renew it while ``token`` holds it (the tiny ``RENEW`` script, sent with EVAL so
        it never meets NOSCRIPT inside a MULTI). Either replies truthy when held."""
        if renew:
            return ("EVAL", lua.RENEW, 1, names.lock, token, self.lease_ms)
        return ("SET", names.lock, token, "NX", "PX", self.lease_ms)

    def take(self, names: Names, token: str) -> Program[bool]:
        """Try once to take the lease; whether ``token`` got it."""
        reply = (yield Pipe((self._lease(names, token),)))[0]
        _first_error([reply])
        return _held(reply)

    def wait(self, names: Names, token: str, deadline: float) -> Program[bool]:
        """Poll for the lease with jittered backoff until ``deadline`` (MEM-12's bound)."""
        delay = POLL_START
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            yield Sleep(min(delay * random.uniform(0.5, 1.5), remaining))
            delay = min(delay * 2, POLL_MAX)
            if (yield from self.take(names, token)):
                return True

    def acquire(self, names: Names, token: str, timeout: float) -> Program[bool]:
        """Take the lease within ``timeout`` seconds; released again if interrupted."""
        deadline = time.monotonic() + max(timeout, 0.0)
        try:
            return (yield from retried(lambda: self.take(names, token))) or (
                yield from self.wait(names, token, deadline))
        except GeneratorExit:
            raise
        except BaseException:
            yield from self.release(names, token)
            raise

    def renew(self, names: Names, token: str) -> Program[bool]:
        """Extend the lease while ``token`` holds it (never re-take it); whether it did."""
        reply = (yield Pipe((self._lease(names, token, renew=True),)))[0]
        _first_error([reply])
        return _held(reply)

    def renew_all(self, leases: Sequence[tuple[Names, str]]) -> Program[None]:
        """Renew many held leases in one round trip (a ``lock()`` renewer's beat)."""
        yield Pipe(tuple(self._lease(names, token, renew=True) for names, token in leases))

    def release(self, names: Names, token: str) -> Program[None]:
        """Compare-and-delete, best effort: an unreleased lease lapses by itself."""
        with contextlib.suppress(StoreError):
            yield from script(lua.RELEASE, (names.lock,), (token,))
