"""``redis://host:6379/0?prefix=flowmem`` — the Redis store (``pip install 'flowmem[redis]'``).

Each conversation is a handful of keys sharing one hash tag (layout in
:mod:`flowmem.stores.redis_scripts`), so one buffer lives on one cluster slot
and every statement of an append is an O(log n) look-up: the cost of an
append does not grow with the conversation.

Why Python plans and Lua applies. The append rules are decided in ONE place,
:func:`flowmem.plan.plan_append`; re-deciding them in Lua would be a second
implementation that could drift from the other backends. So an append is:

1. one pipelined ``MULTI`` round trip reads the planner's view (results and
   declarations of the ids the incoming messages mention, the unanswered calls
   when the append heals) and the buffer's version (a random token);
2. Python plans against that view;
3. ONE Lua script (:data:`~flowmem.stores.redis_scripts.APPLY`) checks the
   version is unchanged and then executes the plan and the window with the
   same statements :mod:`flowmem.stores.sql` runs (the result upsert of
   MEM-1/MEM-10, placeholder inserts after the declaring turn's block, calls
   and pending calls, eviction), sets a new version, and returns
   ``(count, appended)``. If the version moved, it returns ``conflict`` and
   the append reads and plans again (optimistic concurrency).

A script runs atomically and validates its whole input and the type of every
key before its first write, so an append is all or nothing without any lock.

MEM-12. ``append`` still takes the per-key lock (``SET NX PX`` with a random
token, released by compare-and-delete; the first attempt rides in the read's
round trip, the release in the script's) with the bounded wait; past
``lock_timeout`` it goes ahead unserialized and reports ``serialized=False``
— the version check keeps it whole. It also reports ``serialized=False`` when
other writers keep invalidating its plan past ``lock_timeout`` (it keeps
retrying; the turn is never dropped). A lock's lease is ``lock_ttl`` seconds
(URL option, default 10): a writer killed while holding it delays the others
by at most ``lock_timeout`` per append, for at most ``lock_ttl``.

Errors. Connection loss and timeouts raise
:class:`~flowmem.errors.StoreUnavailable`, any other server error
:class:`~flowmem.errors.StoreError`; redis-py never retries on its own. A
failure before the script leaves the buffer untouched; if the connection drops
while the script runs, the append took effect whole or not at all (as with a
lost ``COMMIT`` reply on SQL). Needs Redis 7.0+ (script flags).

Durability is the server's, not flowmem's. flowmem acknowledges an append once
Redis has applied it in memory. Without persistence a restart loses all;
under the default RDB snapshots a crash or kill of Redis loses every write
since the last snapshot (up to an hour when writes are rare); with AOF
``appendfsync everysec`` at most about one second of acknowledged appends;
with ``appendfsync always`` none. Whatever is lost, a buffer is never left
half-appended: AOF and replicas get a script's effects as one
``MULTI``/``EXEC`` block (an incomplete trailing block is dropped on load)
and an RDB snapshot never falls inside a script. Replication is
asynchronous: a failover can lose the last acknowledged appends. Keep
``maxmemory-policy`` at ``noeviction`` (or ``volatile-*``): an ``allkeys-*``
policy may evict one key of a buffer. See ``docs/redis.md``.
"""

from __future__ import annotations

import hashlib
import random
import re
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final, TypeVar

from ..entries import edit_entries
from ..errors import (
    InvalidStoreURL,
    KeyConflict,
    MissingDependency,
    StoreError,
    StoreUnavailable,
)
from ..messages import Message
from ..plan import SLOT, AppendPlan, BufferView, mentioned_ids, needs_pending, plan_append
from ..scopes import StorageKey
from ..store import AppendOutcome, HistoryPage
from . import redis_scripts as lua
from .redis_layout import Names, key_names, plan_args, rewrite, split_url, view_from
from .sql import decode, encode

if TYPE_CHECKING:
    import redis

__all__ = ["RedisStore"]

_T = TypeVar("_T")
_POLL_START: Final = 0.0002
_POLL_MAX: Final = 0.002
_EDIT_LOCK_WAIT: Final = 30.0


def _import_redis() -> ModuleType:
    try:
        import redis
    except ImportError as exc:
        raise MissingDependency("redis", "redis") from exc
    return redis


def _conflict(names: Names) -> KeyConflict:
    key = names.member.decode("utf-8", "surrogatepass")
    return KeyConflict(f"key {key!r} holds a plain value, not a conversation")


@dataclass(frozen=True, slots=True)
class _Snapshot:
    view: BufferView
    version: str


class RedisStore:
    """The Redis backend (design, locking, errors and durability: see the module notes)."""

    def __init__(self, client: redis.Redis, *, prefix: str = "flowmem",
                 lock_ttl: float = 10.0) -> None:
        self._redis = _import_redis()
        if not prefix or "{" in prefix or "}" in prefix:
            raise InvalidStoreURL(f"prefix must be non-empty without braces, got {prefix!r}")
        if not lock_ttl > 0:
            raise InvalidStoreURL(f"lock_ttl must be positive seconds, got {lock_ttl!r}")
        # redis-py types replies as ``bytes | str`` unions (decode_responses decides);
        # this store always reads raw bytes, so the client is handled untyped
        self._client: Any = client
        self.prefix = prefix
        self.lock_ttl = lock_ttl
        self._prefix = prefix.encode("utf-8", "surrogatepass")
        self._closed = False
        self._shas = {src: hashlib.sha1(src.encode()).hexdigest()
                      for src in (lua.APPLY, lua.READ, lua.HISTORY, lua.WRITE, lua.RELEASE)}
        exceptions = self._redis.exceptions
        self._lost: tuple[type[BaseException], ...] = (
            exceptions.ConnectionError, exceptions.TimeoutError, OSError)
        self._failed: type[BaseException] = exceptions.RedisError

    @classmethod
    def from_url(cls, url: str) -> RedisStore:
        """``redis://[user:pass@]host:port/db?prefix=flowmem&lock_ttl=10`` (or ``rediss://``).

        Other query options go to redis-py (``socket_timeout=10`` and
        ``socket_connect_timeout=5`` seconds unless given).
        """
        redis = _import_redis()
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        rest, prefix, lock_ttl = split_url(url)
        try:
            client = redis.Redis.from_url(
                rest, socket_timeout=10.0, socket_connect_timeout=5.0,
                retry=Retry(NoBackoff(), 0))  # flowmem decides what may be retried
            pool = client.connection_pool  # unknown options fail here, not at first use
            pool.connection_class(**pool.connection_kwargs)
        except (ValueError, TypeError) as exc:
            unknown = re.search(r"unexpected keyword argument '([^']+)'", str(exc))
            if unknown is None:
                raise InvalidStoreURL(f"cannot use {url!r}: {exc}") from exc
            from redis.connection import URL_QUERY_ARGUMENT_PARSERS

            from .redis_layout import _OPTIONS
            known = ", ".join([*_OPTIONS, *sorted(URL_QUERY_ARGUMENT_PARSERS)])
            raise InvalidStoreURL(f"unknown option {unknown[1]!r} in the Redis URL {url!r}; "
                                  f"known options: {known}") from None
        store = cls(client, prefix=prefix, lock_ttl=lock_ttl)
        try:
            store._check_server()
        except BaseException:
            client.close()
            raise
        return store

    def _check_server(self) -> None:
        """Connect once (failing fast when unreachable) and load the scripts (Redis 7+)."""
        with self._errors("connect"):
            for src in self._shas:
                self._load(src)

    # -- plumbing ------------------------------------------------------------------
    def _names(self, key: StorageKey) -> Names:
        return key_names(self._prefix, key)

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Map redis-py's exceptions to flowmem's (never leak a driver exception)."""
        if self._closed:
            raise StoreError("the store is closed")
        try:
            yield
        except self._lost as exc:
            raise StoreUnavailable(f"Redis connection lost during {what}: {exc}") from exc
        except self._failed as exc:
            raise StoreError(f"Redis error during {what}: {exc}") from exc

    def _idempotent(self, call: Callable[[], _T]) -> _T:
        """Run a read-only (or repeatable) call, retried once on a dropped connection."""
        try:
            return call()
        except self._lost:
            return call()

    def _script(self, src: str, names: Names, *args: Any) -> Any:
        try:
            return self._client.evalsha(self._shas[src], len(names.keys), *names.keys, *args)
        except self._redis.exceptions.NoScriptError:
            self._load(src)
            return self._client.evalsha(self._shas[src], len(names.keys), *names.keys, *args)

    def _load(self, src: str) -> None:
        try:
            self._client.script_load(src)
        except self._redis.exceptions.ResponseError as exc:
            raise StoreError(f"cannot load flowmem's Lua scripts (Redis 7.0+ needed): "
                             f"{exc}") from exc

    def _pipeline(self, src: str, names: Names, args: Sequence[Any],
                  then: Callable[[Any], None]) -> Any:
        """EVALSHA plus follow-up commands in one non-transactional round trip."""
        for attempt in (0, 1):
            pipe = self._client.pipeline(transaction=False)
            pipe.evalsha(self._shas[src], len(names.keys), *names.keys, *args)
            then(pipe)
            replies = pipe.execute(raise_on_error=False)
            failed = [r for r in replies if isinstance(r, Exception)]
            if attempt == 0 and isinstance(replies[0], self._redis.exceptions.NoScriptError):
                self._load(src)
                continue
            if failed:
                raise failed[0]
            return replies[0]
        raise AssertionError("unreachable")

    # -- values ------------------------------------------------------------------------
    def read(self, key: StorageKey) -> tuple[bool, Any]:
        names = self._names(key)
        with self._errors("read"):
            reply = self._idempotent(lambda: self._script(lua.READ, names))
        kind = reply[0]
        if kind == b"v":
            return True, decode(reply[1].decode())
        if kind == b"b":
            return True, [decode(body.decode()) for body in reply[1:]]
        return False, None

    def write(self, key: StorageKey, value: Any) -> None:
        names = self._names(key)
        text = encode(value)
        with self._errors("write"):
            self._pipeline(lua.WRITE, names, [text],
                           lambda pipe: pipe.zadd(names.index, {names.member: 0}))

    def delete(self, key: StorageKey) -> bool:
        names = self._names(key)
        with self._errors("delete"):
            pipe = self._client.pipeline(transaction=False)
            pipe.delete(*names.keys[:-1])  # everything but the lock, in one atomic DEL
            pipe.zrem(names.index, names.member)
            pipe.exists(names.value, names.meta)
            removed, _, recreated = pipe.execute()
            if recreated:  # re-created by a concurrent writer after our DEL: keep it listed
                self._client.zadd(names.index, {names.member: 0})
        return bool(removed)

    # -- conversations -----------------------------------------------------------------
    def append(self, key: StorageKey, incoming: Sequence[Message], *,
               max_messages: int | None, lock_timeout: float) -> AppendOutcome:
        names = self._names(key)
        ids = sorted(mentioned_ids(incoming))
        heals = needs_pending(incoming)
        token = uuid.uuid4().hex
        deadline = time.monotonic() + max(lock_timeout, 0.0)
        serialized, held = True, False
        with self._errors("append"):
            try:
                held, snapshot = self._idempotent(
                    lambda: self._snapshot(names, ids, heals, token))
                if not held:
                    held = self._wait(names, token, deadline)
                    serialized = held
                    if held:
                        snapshot = self._snapshot(names, ids, heals, None)[1]
                conflicts = 0
                while True:
                    plan = plan_append(snapshot.view, incoming)
                    done = self._apply(names, snapshot.version, plan, max_messages,
                                       token if held else "")
                    if done is not None:
                        held = False  # the script released it
                        return AppendOutcome(done[0], done[1], serialized)
                    conflicts += 1
                    if time.monotonic() >= deadline:
                        serialized = False  # MEM-12: still never dropped, still whole
                    if conflicts > 2:
                        time.sleep(random.uniform(0, min(_POLL_MAX, _POLL_START * conflicts)))
                    snapshot = self._idempotent(
                        lambda: self._snapshot(names, ids, heals, None))[1]
            finally:
                if held:
                    self._release(names, token)

    def _snapshot(self, names: Names, ids: list[str], heals: bool,
                  lock: str | None) -> tuple[bool, _Snapshot]:
        """The planner's view and the buffer's version in one MULTI; maybe take the lock."""
        pipe = self._client.pipeline(transaction=True)
        if lock is not None:
            pipe.execute_command("SET", names.lock, lock, "NX", "PX",
                                 int(self.lock_ttl * 1000), "GET")
        pipe.exists(names.value)
        pipe.hget(names.meta, "ver")
        if ids:
            pipe.hmget(names.res, ids)
            pipe.hmget(names.calls, ids)
        if heals:
            pipe.hgetall(names.pend)
        replies = list(pipe.execute())
        held = lock is not None and replies.pop(0) in (None, lock.encode())
        if replies.pop(0):
            if held:
                self._release(names, lock or "")
            raise _conflict(names)
        version = (replies.pop(0) or b"").decode()
        return held, _Snapshot(view_from(ids, heals, replies), version)

    def _apply(self, names: Names, version: str, plan: AppendPlan,
               max_messages: int | None, lock: str) -> tuple[int, int] | None:
        """Run the plan's script; ``(count, appended)``, or ``None`` on a version conflict."""
        args = [version, uuid.uuid4().hex, lock, SLOT,
                "" if max_messages is None else max_messages, *plan_args(plan)]

        def index(pipe: Any) -> None:
            if not version:  # this append may create the buffer: list its key
                pipe.zadd(names.index, {names.member: 0})

        reply = self._pipeline(lua.APPLY, names, args, index)
        if reply[0] == b"value":
            raise _conflict(names)
        if reply[0] == b"conflict":
            return None
        return int(reply[1]), int(reply[2])

    def history(self, key: StorageKey, *, last: int | None = None,
                before: int | None = None) -> HistoryPage:
        names = self._names(key)
        args = ("" if last is None else last, "" if before is None else before)
        with self._errors("history"):
            reply = self._idempotent(lambda: self._script(lua.HISTORY, names, *args))
        positions = [int(p) for p in reply[1::2]]
        messages = [decode(body.decode()) for body in reply[2::2]]
        more = bool(reply[0]) and bool(positions)
        return HistoryPage(messages, positions, positions[0] if more else None)

    def edit(self, key: StorageKey, position: int, message: Message | None) -> bool:
        """The administrative path (MEM-15): rewrite the buffer's keys under ``WATCH``."""
        names = self._names(key)
        with self._hold(names, _EDIT_LOCK_WAIT), self._errors("edit"):
            while True:
                try:
                    return self._edit(names, position, message)
                except self._redis.exceptions.WatchError:
                    continue  # an unserialized append got in between: read again

    def _edit(self, names: Names, position: int, message: Message | None) -> bool:
        with self._client.pipeline(transaction=True) as pipe:
            pipe.watch(names.meta, names.value)
            if pipe.exists(names.value) or not pipe.exists(names.meta):
                return False
            stored = pipe.zrange(names.pos, 0, -1)
            bodies = pipe.hmget(names.body, stored) if stored else []
            entries = [(int(p), decode(b.decode())) for p, b in zip(stored, bodies, strict=True)]
            edited = edit_entries(entries, position, message)
            if edited is None:
                return False
            keys = rewrite(edited)
            pipe.multi()
            pipe.delete(names.pos, names.body, names.info, names.res, names.calls, names.pend)
            for target, mapping in ((names.body, keys.body), (names.info, keys.info),
                                    (names.res, keys.res), (names.calls, keys.calls),
                                    (names.pend, keys.pend)):
                if mapping:
                    pipe.hset(target, mapping=mapping)
            if keys.pos:
                pipe.zadd(names.pos, keys.pos)
            pipe.hset(names.meta, mapping={"ver": uuid.uuid4().hex, "count": len(edited)})
            pipe.execute()
            return True

    def keys(self, scope: str, scope_id: str, *, prefix: str = "",
             after: str | None = None, limit: int = 100) -> list[str]:
        start = prefix.encode("utf-8", "surrogatepass")
        upper = b"(" + start + b"\xff" if start else b"+"
        low = b"[" + start
        if after is not None and after.encode("utf-8", "surrogatepass") >= start:
            low = b"(" + after.encode("utf-8", "surrogatepass")
        index = self._names(StorageKey(scope, scope_id, "")).index
        found: list[str] = []
        with self._errors("keys"):
            while len(found) < limit:
                want = limit - len(found)
                batch = self._client.zrangebylex(index, low, upper, start=0, num=want)
                if not batch:
                    break
                pipe = self._client.pipeline(transaction=False)
                for member in batch:  # an index entry can outlive its key for a moment
                    names = self._names(StorageKey(scope, scope_id,
                                                   member.decode("utf-8", "surrogatepass")))
                    pipe.exists(names.value, names.meta)
                for member, live in zip(batch, pipe.execute(), strict=True):
                    if live:
                        found.append(member.decode("utf-8", "surrogatepass"))
                if len(batch) < want:
                    break
                low = b"(" + batch[-1]
        return found

    # -- MEM-12 locks --------------------------------------------------------------------
    def lock(self, key: StorageKey, timeout: float) -> AbstractContextManager[bool]:
        return self._hold(self._names(key), timeout)

    @contextmanager
    def _hold(self, names: Names, timeout: float) -> Iterator[bool]:
        token = uuid.uuid4().hex
        with self._errors("lock"):
            held = self._idempotent(lambda: self._acquire(names, token)) or self._wait(
                names, token, time.monotonic() + max(timeout, 0.0))
        try:
            yield held
        finally:
            if held:
                self._release(names, token)

    def _acquire(self, names: Names, token: str) -> bool:
        old = self._client.execute_command("SET", names.lock, token, "NX", "PX",
                                           int(self.lock_ttl * 1000), "GET")
        return old is None or old == token.encode()

    def _wait(self, names: Names, token: str, deadline: float) -> bool:
        delay = _POLL_START
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(delay * random.uniform(0.5, 1.5), remaining))
            delay = min(delay * 2, _POLL_MAX)
            if self._acquire(names, token):
                return True

    def _release(self, names: Names, token: str) -> None:
        """Compare-and-delete; best effort (an unreleased lock expires after ``lock_ttl``)."""
        try:
            sha = self._shas[lua.RELEASE]
            try:
                self._client.evalsha(sha, 1, names.lock, token)
            except self._redis.exceptions.NoScriptError:
                self._load(lua.RELEASE)
                self._client.evalsha(sha, 1, names.lock, token)
        except (self._failed, *self._lost):
            pass

    def close(self) -> None:
        self._closed = True
        self._client.close()
