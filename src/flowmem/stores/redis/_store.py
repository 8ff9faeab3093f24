"""``redis://host:6379/0?prefix=flowmem`` — the Redis store (``pip install 'flowmem[redis]'``).

Each conversation is a handful of keys sharing one hash tag (layout in
:mod:`flowmem.stores.redis._scripts`), so one buffer lives on one cluster slot
and every statement of an append is an O(log n) look-up: the cost of an
append does not grow with the conversation.

Why Python plans and Lua applies. The append rules are decided in ONE place,
:func:`flowmem.plan.plan_append`; re-deciding them in Lua would be a second
implementation that could drift from the other backends. So an append is
ONE round trip on the common path (:mod:`flowmem.stores.redis._append`):

1. Python plans against a *guess* of the planner's view (results and
   declarations of the ids the incoming messages mention, the unanswered
   calls when the append heals), taken from what this store's earlier appends
   learned (:mod:`flowmem.stores.redis._view_cache`: a bounded LRU per store);
2. ONE Lua script (:data:`~flowmem.stores.redis._scripts.APPLY`) checks the
   MEM-12 lease and that the buffer still matches the guess, then executes
   the plan and the window with the same statements :mod:`flowmem.stores.sql._conversations`
   runs (the result upsert of MEM-1/MEM-10, placeholder inserts after the
   declaring turn's block, calls and pending calls, eviction), sets a new
   version, and returns ``(count, appended)`` and how the ids it touched are
   now. If the buffer no longer matches the guess — another writer touched
   what this append mentions — it changes nothing and returns the true view,
   and the append plans again (optimistic concurrency: a second round trip,
   only then). A wrong guess can cost a round trip, never a wrong decision.

A script runs atomically and validates its whole input and the type of every
key before its first write, so an append is all or nothing without any lock.

One copy of the logic, two faces. All of the above is written once as
sans-I/O programs (:mod:`flowmem.stores.redis._programs`); this blocking store
and :class:`~flowmem.stores.redis._aio.AsyncRedisStore` only run them
(:mod:`flowmem.stores.redis._drivers`).

MEM-12. The lock is a *lease*: a random token set for ``lock_ttl`` seconds
(URL option, default 1) when free (``SET NX PX``), renewed only by its holder
(the ``RENEW`` script; a ``lock()`` holder's background renewer every
``lock_ttl / 3``) and released by compare-and-delete. The common append never
takes it: its one script is the critical section and checks that no other
token holds the lease. When one does, the script changes nothing and replies
``locked``; the append then waits for the lease with the bounded wait (polling
``SET NX PX``), and sends its script again holding it (the script releases
it). Past ``lock_timeout`` it goes ahead unserialized and reports
``serialized=False`` — the script keeps it whole. It also reports
``serialized=False`` when other writers keep invalidating its plan past
``lock_timeout`` (it keeps retrying; the turn is never dropped). The token
fences it: nobody renews or releases another's lease, and an append reports
``serialized=True`` only if its script found no other token holding the
lease. A holder that dies (kill -9, a lost connection, a Redis restart) stops
renewing, so its lease is gone within ``lock_ttl``. Threads of one store
appending to one conversation first queue on an in-process lock
(:class:`~flowmem.stores._locks.KeyLocks`), so only one of them polls Redis;
that wait counts against the same ``lock_timeout``.

Errors. Connection loss and timeouts raise
:class:`~flowmem.errors.StoreUnavailable`, any other server error
:class:`~flowmem.errors.StoreError`; redis-py never retries on its own. A
failure before the script leaves the buffer untouched; if the connection drops
or times out once the script was sent, the append took effect whole or not at
all (as with a lost ``COMMIT`` reply on SQL; retry with an idempotency key).
Needs Redis 7.0+ (script flags).

Durability is the server's, not flowmem's. flowmem acknowledges an append once
Redis has applied it in memory. Without persistence a restart loses all;
under the default RDB snapshots a crash or kill of Redis loses every write
since the last snapshot (up to an hour when writes are rare); with AOF
``appendfsync everysec`` at most about one second of acknowledged appends;
with ``appendfsync always`` none. Whatever is lost, a buffer is never left
half-appended: AOF and replicas get a script's effects as one
``MULTI``/``EXEC`` block (an incomplete trailing block is dropped on load)
and an RDB snapshot never falls inside a script. Replication is
asynchronous: a failover can lose the last acknowledged appends, unless
``?wait_replicas=N``: every change is then followed by ``WAIT`` on its own
connection and acknowledged only once N replicas confirmed it, else
:class:`~flowmem.errors.OutcomeUnknown` (:class:`~._requests.Confirm`). Keep
``maxmemory-policy`` at ``noeviction`` (or ``volatile-*`` without retention):
an ``allkeys-*`` policy may evict one key of a buffer. See ``docs/redis.md``.

Retention. Under a policy every key of a conversation carries one Redis
expiry instant, set by the script that writes (``PEXPIREAT``, one slot);
Redis deletes the keys itself, and reads compare the instant with the
coordinator's clock (:mod:`flowmem.stores.redis._expiry_lua`). :meth:`RedisStore.sweep`
has nothing to delete.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

from ...errors import StoreError
from ...messages import Message
from ...retention import Expiry, Swept
from ...scopes import StorageKey
from ...store import AppendOutcome, DeleteOutcome, Erased, HistoryPage, Idempotency
from .._locks import KeyLocks
from ._clients import import_redis, open_blocking
from ._drivers import Driver, Renewer, drive
from ._keys import check_options
from ._programs import Program, RedisPrograms, T, setup
from ._requests import confirmation

if TYPE_CHECKING:
    import redis

__all__ = ["RedisStore", "check_options"]

_fresh_gates_in_child: weakref.WeakSet[RedisStore] = weakref.WeakSet()


def _reset_gates() -> None:
    # a gate held by another thread of the parent at fork() would stay held in the child
    for store in list(_fresh_gates_in_child):
        store._gates = KeyLocks()


os.register_at_fork(after_in_child=_reset_gates)


class RedisStore:
    """The Redis backend (design, locking, errors and durability: see the module notes)."""

    def __init__(self, client: redis.Redis | redis.RedisCluster, *, prefix: str = "flowmem",
                 lock_ttl: float = 1.0, wait_replicas: int = 0,
                 wait_timeout: float = 1.0) -> None:
        """``client``: a ``redis.Redis`` or a ``redis.cluster.RedisCluster`` reading raw
        bytes (no ``decode_responses``), whose own retries are off. ``wait_replicas``:
        every change is acknowledged only once that many replicas confirmed it within
        ``wait_timeout`` seconds (``WAIT``), else :class:`~flowmem.errors.OutcomeUnknown`."""
        redis = import_redis()
        check_options(prefix, lock_ttl)
        confirm = confirmation(wait_replicas, wait_timeout)
        self.prefix = prefix
        self.lock_ttl = lock_ttl
        self.cluster = isinstance(client, redis.RedisCluster)
        self.programs = RedisPrograms(prefix.encode("utf-8", "surrogatepass"),
                                      max(1, int(lock_ttl * 1000)), cluster=self.cluster,
                                      confirm=confirm)
        self._driver = Driver(client)
        self._gates = KeyLocks()  # threads of this store queue per conversation (no file)
        _fresh_gates_in_child.add(self)
        self._renewer = Renewer(lambda leases: self._run(self.programs.renew_all(leases), "lock"),
                                lock_ttl / 3)
        self._closed = False

    @classmethod
    def from_url(cls, url: str) -> RedisStore:
        """``redis://[user:pass@]host:port/db?prefix=flowmem&lock_ttl=1`` (or ``rediss://``;
        ``&wait_replicas=1&wait_timeout=1``: every change confirmed by a replica).

        A Redis Cluster is detected on connect (``INFO cluster``), or named:
        ``?cluster=yes|no``, several seed nodes (``redis://h1:7000,h2:7001/0``,
        or ``?node=host:port`` repeated). Other query options go to redis-py
        (``socket_timeout=10`` and ``socket_connect_timeout=5`` seconds unless
        given). Connects once, failing fast when unreachable, and loads the
        scripts (Redis 7+; on a cluster each node loads them as they are first run).
        """
        client, parts, _ = open_blocking(url)
        try:
            store = cls(client, prefix=parts.prefix, lock_ttl=parts.lock_ttl,
                        wait_replicas=parts.wait_replicas, wait_timeout=parts.wait_timeout)
            store._run(setup(store.cluster), "connect")
        except BaseException:
            client.close()
            raise
        return store

    def _run(self, program: Program[T], what: str) -> T:
        if self._closed:
            program.close()
            raise StoreError("the store is closed")
        return drive(program, self._driver, what)

    # -- the Store protocol ------------------------------------------------------------
    def read(self, key: StorageKey, *, now: float | None = None) -> tuple[bool, Any]:
        return self._run(self.programs.read(key, now), "read")

    def write(self, key: StorageKey, value: Any, *,
              idempotency: Idempotency | None = None, replace: bool = False,
              expiry: Expiry | None = None) -> bool:
        return self._run(self.programs.write(key, value, idempotency, replace, expiry), "write")

    def delete(self, key: StorageKey, *,
               idempotency: Idempotency | None = None) -> DeleteOutcome:
        return self._run(self.programs.delete(key, idempotency), "delete")

    def append(self, key: StorageKey, incoming: Sequence[Message], *,
               max_messages: int | None, lock_timeout: float,
               idempotency: Idempotency | None = None, tail: int = 0,
                     expiry: Expiry | None = None) -> AppendOutcome:
        began = time.monotonic()
        with self._gates.hold(key, lock_timeout) as queued:  # this store's threads queue
            left = max(0.0, lock_timeout - (time.monotonic() - began)) if queued else 0.0
            program = self.programs.append(key, incoming, max_messages, left, idempotency,
                                            tail, expiry)
            return self._run(program, "append")

    def history(self, key: StorageKey, *, last: int | None = None,
                before: int | None = None, now: float | None = None) -> HistoryPage:
        return self._run(self.programs.history(key, last, before, now), "history")

    # -- retention: Redis deletes expired keys itself -------------------------------------
    native_expiry = True
    """Expired data is deleted by Redis's own expiry (every key of it carries the
    instant), not by :meth:`sweep`."""

    def touch(self, key: StorageKey, expiry: Expiry) -> bool:
        """Move a live key's expiry (``refresh_on_read``); whether it was there."""
        return self._run(self.programs.touch(key, expiry), "read")

    def sweep(self, now: float, *, batch: int = 500) -> Swept:
        """Nothing to delete: Redis deletes every key of expired data at its instant
        (until then reads at ``now`` see it absent). Counts nothing, ``done``."""
        if self._closed:
            raise StoreError("the store is closed")
        return Swept()

    def edit(self, key: StorageKey, position: int, message: Message | None) -> bool:
        """The administrative path (MEM-15): a version-checked rewrite under the lease."""
        return self._run(self.programs.edit(key, position, message), "edit")

    def keys(self, scope: str, scope_id: str, *, prefix: str = "",
             after: str | None = None, limit: int = 100,
             now: float | None = None) -> list[str]:
        return self._run(self.programs.keys(scope, scope_id, prefix, after, limit, now), "keys")

    def erase(self, scope: str, scope_id: str, *, dry_run: bool = False) -> Erased:
        """The fence, key by key, a sweep (:mod:`flowmem.stores.redis._erasure`)."""
        return self._run(self.programs.erase(scope, scope_id, dry_run), "erase")

    def lock(self, key: StorageKey, timeout: float) -> AbstractContextManager[bool]:
        """The MEM-12 lease of ``key``, renewed by the store's renewer thread meanwhile."""
        return self._hold(key, timeout)

    @contextmanager
    def _hold(self, key: StorageKey, timeout: float) -> Iterator[bool]:
        names = self.programs.names(key)
        token = self.programs.new_token()
        if not self._run(self.programs.acquire(names, token, timeout), "lock"):
            yield False
            return
        self._renewer.add(names, token)
        try:
            yield True
        finally:
            self._renewer.discard(token)
            if not self._closed:
                self._run(self.programs.release(names, token), "lock")

    def close(self) -> None:
        self._closed = True
        self._renewer.close()
        self._driver.client.close()
