"""The Redis store's logic as sans-I/O programs, shared by the sync and asyncio faces.

Every store operation is a *program*: a generator that yields I/O requests
(:class:`Pipe`, :class:`Sleep`: :mod:`flowmem.stores.redis_requests`) and
receives their replies, as :mod:`flowmem.stores.sql` does for SQL.

A driver (:mod:`flowmem.stores.redis_drivers`) runs a program on
``redis.Redis`` or on ``redis.asyncio.Redis``. When a request fails as a
whole — the connection is lost, the caller is cancelled — the driver *throws*
the (mapped) exception into the program at its ``yield``, so the program's
own ``try``/``finally`` can still release the MEM-12 lease it may hold.

Locks are leases (MEM-12, see :mod:`flowmem.stores.redis`): a random token
set for ``lease_ms`` when the key is free (``SET NX PX``), extended
only by its holder (a ``lock()`` holder from the driver's renewer, an append
that waited for it by its script) and released by compare-and-delete — so a
dead holder's lease lapses by itself. The common append never takes it: its
one script checks nobody else holds it (:mod:`flowmem.stores.redis_append`).

The request vocabulary lives in :mod:`flowmem.stores.redis_requests`.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Sequence
from typing import Any, Final

from ..entries import edit_entries
from ..errors import StoreError
from ..messages import Message
from ..scopes import StorageKey
from ..store import AppendOutcome, HistoryPage, Idempotency
from . import redis_scripts as lua
from .redis_append import Appends
from .redis_layout import Names, key_names, rewrite
from .redis_requests import (
    POLL_MAX,
    POLL_START,
    Command,
    NoScript,
    Pipe,
    Program,
    Request,
    Sleep,
    T,
    first_error,
    held,
    idem_conflict,
    key_conflict,
    page_of,
    retried,
    script,
    setup,
)
from .redis_views import ViewCache
from .sql_program import decode, decode_all, encode

__all__ = ["NoScript", "Pipe", "Program", "RedisPrograms", "Request", "Sleep", "T", "setup"]

EDIT_LOCK_WAIT: Final = 30.0


class RedisPrograms:
    """The programs of every store operation for one key prefix and lease length."""

    def __init__(self, prefix: bytes, lease_ms: int, cache: ViewCache | None = None) -> None:
        self.prefix = prefix
        self.lease_ms = lease_ms
        self.appends = Appends(self, cache)

    def names(self, key: StorageKey) -> Names:
        return key_names(self.prefix, key)

    @staticmethod
    def new_token() -> str:
        """A lease token (or a version): random, never reused."""
        return os.urandom(16).hex()

    # -- values -------------------------------------------------------------------
    def read(self, key: StorageKey) -> Program[tuple[bool, Any]]:
        names = self.names(key)
        reply = yield from retried(lambda: script(lua.READ, names.keys, ()))
        if reply[0] == b"v":
            return True, decode(reply[1].decode())
        if reply[0] == b"b":
            return True, decode_all([body.decode() for body in reply[1:]])
        return False, None

    def idempotency_key(self, idempotency: Idempotency) -> bytes:
        """Where an idempotency record lives (one key per idempotency key, with a TTL)."""
        return self.prefix + b":idem:" + idempotency.key.encode("utf-8", "surrogatepass")

    def idem(self, idempotency: Idempotency) -> tuple[bytes, tuple[str, int, str]]:
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
            record, extra = self.idem(idempotency)
            keys, args = (*keys, record), (*args, *extra)
        reply = yield from script(lua.WRITE, keys, args, (("ZADD", names.index, 0, names.member),))
        if reply == b"idem_conflict":
            raise idem_conflict(idempotency)

    def delete(self, key: StorageKey, idempotency: Idempotency | None = None) -> Program[bool]:
        names = self.names(key)
        if idempotency is not None:
            record, extra = self.idem(idempotency)
            reply = yield from script(lua.DELETE, (*names.keys, record), extra,
                                      (("ZREM", names.index, names.member),))
            if reply[0] == b"idem_conflict":
                raise idem_conflict(idempotency)
            found = bool(int(reply[1]))
            replies = yield Pipe((("EXISTS", names.value, names.meta),))
        else:
            replies = yield Pipe((("DEL", *names.keys[:-1]),  # all but the lock, one atomic DEL
                                  ("ZREM", names.index, names.member),
                                  ("EXISTS", names.value, names.meta)))
            found = bool(replies[0])
        first_error(replies)
        if replies[-1]:  # re-created by a concurrent writer after our DEL: keep it listed
            first_error((yield Pipe((("ZADD", names.index, 0, names.member),))))
        return found

    def history(self, key: StorageKey, last: int | None,
                before: int | None) -> Program[HistoryPage]:
        names = self.names(key)
        args = ("" if last is None else last, "" if before is None else before)
        reply = yield from retried(lambda: script(lua.HISTORY, names.keys, args))
        if reply[0] == b"value":
            raise key_conflict(names)
        return page_of(reply)

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
            first_error([batch])
            if not batch:
                break
            members = [m.decode("utf-8", "surrogatepass") for m in batch]
            checks = tuple(("EXISTS", *self.names(StorageKey(scope, scope_id, m)).keys[:2])
                           for m in members)  # an index entry can outlive its key a moment
            live = yield Pipe(checks)
            first_error(live)
            found += [m for m, alive in zip(members, live, strict=True) if alive]
            if len(batch) < want:
                break
            low = b"(" + batch[-1]
        return found

    # -- appends (redis_append: one round trip on the common path) -----------------------
    def append(self, key: StorageKey, incoming: Sequence[Message], max_messages: int | None,
               lock_timeout: float, idempotency: Idempotency | None = None,
               tail: int = 0) -> Program[AppendOutcome]:
        """The append program (:class:`~flowmem.stores.redis_append.Appends`)."""
        return self.appends.append(key, incoming, max_messages, lock_timeout, idempotency,
                                   tail)

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
        first_error(replies)
        exists, version, stored, bodies = replies[:4]
        if exists or version is None:
            return None
        return version.decode(), [(int(p), decode(bodies[p].decode())) for p in stored]

    @staticmethod
    def _edit_args(version: str, edited: list[tuple[int, Message]]) -> list[Any]:
        keys = rewrite(edited)
        args: list[Any] = [version, RedisPrograms.new_token(), len(edited), len(keys.pos),
                           *keys.pos]
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
        first_error([reply])
        return held(reply)

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
        first_error([reply])
        return held(reply)

    def renew_all(self, leases: Sequence[tuple[Names, str]]) -> Program[None]:
        """Renew many held leases in one round trip (a ``lock()`` renewer's beat)."""
        yield Pipe(tuple(self._lease(names, token, renew=True) for names, token in leases))

    def release(self, names: Names, token: str) -> Program[None]:
        """Compare-and-delete, best effort: an unreleased lease lapses by itself."""
        with contextlib.suppress(StoreError):
            yield from script(lua.RELEASE, (names.lock,), (token,))
