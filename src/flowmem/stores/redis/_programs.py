"""The Redis store's logic as sans-I/O programs, shared by the sync and asyncio faces.

Every store operation is a *program*: a generator that yields I/O requests
(:class:`Pipe`, :class:`Sleep`: :mod:`flowmem.stores.redis._requests`) and
receives their replies, as :mod:`flowmem.stores.sql._conversations` does for SQL.

A driver (:mod:`flowmem.stores.redis._drivers`) runs a program on
``redis.Redis`` or on ``redis.asyncio.Redis``. When a request fails as a
whole — the connection is lost, the caller is cancelled — the driver *throws*
the (mapped) exception into the program at its ``yield``, so the program's
own ``try``/``finally`` can still release the MEM-12 lease it may hold.

Locks are leases (MEM-12, see :mod:`flowmem.stores.redis`): a random token
set for ``lease_ms`` when the key is free (``SET NX PX``), extended
only by its holder (a ``lock()`` holder from the driver's renewer, an append
that waited for it by its script) and released by compare-and-delete — so a
dead holder's lease lapses by itself. The common append never takes it: its
one script checks nobody else holds it (:mod:`flowmem.stores.redis._append`).

The request vocabulary lives in :mod:`flowmem.stores.redis._requests`.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import time
from collections.abc import Sequence
from typing import Any, Final

from ...entries import edit_entries
from ...errors import StoreError
from ...messages import Message
from ...retention import Expiry
from ...scopes import StorageKey
from ...store import AppendOutcome, DeleteOutcome, Erased, HistoryPage, Idempotency
from .._codec import decode, decode_all, encode
from .._conflicts import conversation_conflict, erasure_refusal
from . import _scripts as lua
from ._append import Appends
from ._erasure import erase
from ._keys import Names, idem_name, key_names, rewrite
from ._requests import (
    POLL_MAX,
    POLL_START,
    Command,
    Confirm,
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
    ms,
    page_of,
    retention_args,
    retried,
    script,
    setup,
)
from ._view_cache import ViewCache

__all__ = ["NoScript", "Pipe", "Program", "RedisPrograms", "Request", "Sleep", "T", "setup"]

EDIT_LOCK_WAIT: Final = 30.0


def _state(value: int, meta: int, now: float | None) -> str:
    """A listed key by the ``PEXPIRETIME`` of its ``:v`` and ``:meta`` (``-2``: absent):
    ``gone`` (neither exists), ``expired`` (by ``now``: hidden, Redis deletes it) or
    ``live``."""
    stored = meta if meta != -2 else value
    if stored == -2:
        return "gone"
    if now is not None and 0 <= stored <= math.floor(now * 1000):  # as ms() rounds it
        return "expired"
    return "live"


class RedisPrograms:
    """The programs of every store operation for one key prefix and lease length.

    ``cluster``: the server is a Redis Cluster. Then the scope index lives in
    another slot than the conversations it lists, so no script may touch it:
    the programs update it in steps of their own (see :meth:`listed` and
    :meth:`unlisted`); on a standalone server the scripts update it atomically.
    ``confirm``: the ``WAIT`` that follows every script changing data
    (``?wait_replicas=``; ``None``: acknowledged once the primary applied it).
    """

    def __init__(self, prefix: bytes, lease_ms: int, cache: ViewCache | None = None, *,
                 cluster: bool = False, confirm: Confirm | None = None) -> None:
        self.prefix = prefix
        self.lease_ms = lease_ms
        self.cluster = cluster
        self.confirm = confirm
        self.appends = Appends(self, cache)

    def names(self, key: StorageKey) -> Names:
        return key_names(self.prefix, key)

    @staticmethod
    def new_token() -> str:
        """A lease token (or a version): random, never reused."""
        return os.urandom(16).hex()

    # -- values -------------------------------------------------------------------
    def read(self, key: StorageKey, now: float | None = None) -> Program[tuple[bool, Any]]:
        """The key's value or messages; absent when expired by ``now`` (retention)."""
        names = self.names(key)
        reply = yield from retried(lambda: script(lua.READ, names.keys, (ms(now),)))
        if reply[0] == b"v":
            return True, decode(reply[1].decode())
        if reply[0] == b"b":
            return True, decode_all([body.decode() for body in reply[1:]])
        return False, None

    def idem(self, names: Names, idempotency: Idempotency | None,
             ) -> tuple[bytes, tuple[Any, ...]]:
        """The record's key and the scripts' arguments: fingerprint, TTL (ms), the clock
        (a name never written and ``("", 0, "0")`` without an idempotency key)."""
        if idempotency is None:
            return names.tag + b":idem", ("", 0, "0")
        ttl_ms = max(1, int(idempotency.ttl * 1000))
        return (idem_name(names, idempotency.key),
                (idempotency.fingerprint, ttl_ms, repr(float(idempotency.now))))

    def script_keys(self, names: Names, record: bytes) -> tuple[bytes, ...]:
        """A write script's keys: the buffer's, the idempotency record, the scope index
        (updated in the same atomic step) and the scope id's erasure fence — on a
        cluster, where those sit in another slot, a name never written and the key's
        tombstone (:mod:`._erasure`)."""
        if self.cluster:
            return (*names.keys, record, names.tag + b":idx", names.gone)
        return (*names.keys, record, names.index, names.fence)

    # -- the scope index on a cluster ------------------------------------------------
    # An entry is added BEFORE the script that may create the key (so an acknowledged
    # write is listed), and again after it when the script created the key (a delete
    # or a keys() repair may have removed the entry in between). An entry is removed
    # only AFTER its key is gone, and put back when the key exists again by then.
    def listed(self, names: Names, key: StorageKey) -> Program[None]:
        """``ZADD`` the key to its scope index (idempotent), before a script that may
        create it: refused while the scope id is erased (:mod:`._erasure`). Confirmed
        by replicas when asked, as the change it lists: a failover must not keep an
        acknowledged conversation and lose its listing."""
        if not (yield from script(lua.LIST, (names.index, names.fence), (names.member,),
                                  self.confirm)):
            raise erasure_refusal(key)

    def relisted(self, names: Names) -> Program[bool]:
        """The key listed again after a script created it; best effort (the key is
        stored either way): whether it is listed."""
        try:
            first_error((yield Pipe((("ZADD", names.index, 0, names.member),))))
        except StoreError:
            return False
        return True

    def unlisted(self, index: bytes, scope: str, scope_id: str,
                 members: Sequence[bytes]) -> Program[None]:
        """Take ``members`` whose keys are gone out of ``index``, then put back any whose
        key exists again (re-created concurrently)."""
        first_error((yield Pipe((("ZREM", index, *members),))))
        names = [self.names(StorageKey(scope, scope_id, m.decode("utf-8", "surrogatepass")))
                 for m in members]
        alive = yield Pipe(tuple(("EXISTS", n.value, n.meta) for n in names))
        first_error(alive)
        back = [n.member for n, live in zip(names, alive, strict=True) if live]
        if back:
            first_error((yield Pipe((("ZADD", index, *(x for m in back for x in (0, m))),))))

    def write(self, key: StorageKey, value: Any, idempotency: Idempotency | None = None,
              replace: bool = False, expiry: Expiry | None = None) -> Program[bool]:
        """Whether it replayed an earlier write under ``idempotency`` (nothing changed);
        with ``expiry`` the value's keys get the policy's instant in the same script."""
        names = self.names(key)
        record, extra = self.idem(names, idempotency)
        if self.cluster:
            yield from self.listed(names, key)
        member = b"" if self.cluster else names.member
        reply = yield from script(lua.WRITE, self.script_keys(names, record),
                                  (encode(value), *extra, member, b"1" if replace else b"",
                                   *retention_args(expiry)), self.confirm)
        if reply == b"erased":
            raise erasure_refusal(key)
        if reply == b"idem_conflict":
            raise idem_conflict(idempotency)
        if reply == b"conversation":
            raise conversation_conflict(key)
        if reply == b"new" and self.cluster:
            yield from self.relisted(names)
        return bool(reply == b"replay")

    def delete(self, key: StorageKey,
               idempotency: Idempotency | None = None) -> Program[DeleteOutcome]:
        """Whether the key held anything; a repeat under ``idempotency`` replays the first
        answer, decided inside the one script that deletes."""
        names = self.names(key)
        record, extra = self.idem(names, idempotency)
        member = b"" if self.cluster else names.member
        reply = yield from script(lua.DELETE, self.script_keys(names, record),
                                  (*extra, member), self.confirm)
        if reply[0] == b"idem_conflict":
            raise idem_conflict(idempotency)
        if reply[0] == b"ok" and self.cluster:
            yield from self.unlisted(names.index, key.scope, key.scope_id, (names.member,))
        return DeleteOutcome(bool(int(reply[1])), replayed=reply[0] == b"replay")

    def history(self, key: StorageKey, last: int | None, before: int | None,
                now: float | None = None) -> Program[HistoryPage]:
        names = self.names(key)
        args = ("" if last is None else last, "" if before is None else before, ms(now))
        reply = yield from retried(lambda: script(lua.HISTORY, names.keys, args))
        if reply[0] == b"value":
            raise key_conflict(names)
        return page_of(reply)

    def touch(self, key: StorageKey, expiry: Expiry) -> Program[bool]:
        """Move a live key's expiry (``refresh_on_read``); whether it was there."""
        names = self.names(key)
        reply = yield from retried(lambda: script(lua.TOUCH, names.keys,
                                                  (ms(expiry.now), ms(expiry.at))))
        return bool(reply)

    def keys(self, scope: str, scope_id: str, prefix: str, after: str | None,
             limit: int, now: float | None = None) -> Program[list[str]]:
        """The scope index's entries whose key exists and has not expired by ``now``;
        entries whose key does not exist are taken out (an append that failed after
        listing its key, on a cluster; a key Redis expired)."""
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
            dues = yield Pipe(tuple(("PEXPIRETIME", part) for m in members
                                    for part in self.names(StorageKey(scope, scope_id, m))
                                    .keys[:2]))
            first_error(dues)
            states = [_state(value, meta, now) for value, meta in zip(dues[::2], dues[1::2],
                                                                        strict=True)]
            found += [m for m, state in zip(members, states, strict=True) if state == "live"]
            dead = [m for m, state in zip(batch, states, strict=True) if state == "gone"]
            if dead:
                yield from self.unlisted(index, scope, scope_id, dead)
            if len(batch) < want:
                break
            low = b"(" + batch[-1]
        return found

    def erase(self, scope: str, scope_id: str, dry_run: bool) -> Program[Erased]:
        """The erasure of one identity scope id (:mod:`._erasure`)."""
        return erase(self, scope, scope_id, dry_run=dry_run)

    # -- appends (redis_append: one round trip on the common path) -----------------------
    def append(self, key: StorageKey, incoming: Sequence[Message], max_messages: int | None,
               lock_timeout: float, idempotency: Idempotency | None = None,
               tail: int = 0, expiry: Expiry | None = None) -> Program[AppendOutcome]:
        """The append program (:class:`~flowmem.stores.redis._append.Appends`)."""
        return self.appends.append(key, incoming, max_messages, lock_timeout, idempotency,
                                   tail, expiry)

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
            done = yield from script(lua.EDIT, names.keys, self._edit_args(version, edited),
                                     self.confirm)
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
