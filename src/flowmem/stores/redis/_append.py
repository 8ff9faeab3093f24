"""The Redis append program: ONE round trip on the common path.

:func:`flowmem.plan.plan_append` decides the rules (MEM-1/2/3/10) against a
view of the buffer; here the view is *guessed* from what this store learned
(:mod:`flowmem.stores.redis._view_cache`) instead of read, and the plan travels
with the guess to the ``APPLY`` script (:mod:`flowmem.stores.redis._scripts`),
which in one atomic step:

1. replies ``locked`` if another token holds the MEM-12 lease (nothing changed):
   the append then waits for the lease with the bounded wait (polling ``SET NX
   PX`` with its own token) and sends the script again holding it; past
   ``lock_timeout`` it sends it telling the script to go ahead unserialized;
2. replays or refuses a repeated idempotency key;
3. checks the buffer still matches the guess, else replies ``conflict`` with
   the true view (nothing changed): the append plans again against it and
   sends again (optimistic concurrency; a second round trip only then);
4. applies the plan, sets a new version (the MEM-15 edit checks it), releases
   the lease if the token held it, and replies how the ids it touched are now,
   which this store remembers for its next append.

So the common append — the lease free, nobody else wrote what it mentions —
is one ``EVALSHA``. On a standalone server the script also lists the key in
its scope's index (the first time this store appends to it, or when it
creates the buffer). On a cluster the index sits in another slot: the first
append of this store to a conversation lists it in a round trip of its own
BEFORE the script, and an append that created the buffer lists it again after
(a concurrent delete may have unlisted it); that second step is best effort —
the append is stored and acknowledged either way. The lease is never taken on
that path: the script *is* the critical section. ``serialized`` is true when
the script found no other token holding the lease.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...call_ids import PerTurn, per_turn_lookups
from ...messages import Message
from ...plan import SLOT, AppendPlan, mentioned_ids, needs_pending, plan_append
from ...retention import Expiry
from ...scopes import StorageKey
from ...store import AppendOutcome, AppendStats, Idempotency
from .._conflicts import erasure_refusal
from . import _scripts as lua
from ._keys import Names, plan_args
from ._requests import (
    POLL_MAX,
    POLL_START,
    Program,
    Sleep,
    idem_conflict,
    key_conflict,
    ms,
    page_of,
    retention_args,
    script,
)
from ._view_cache import Facts, Guess, ViewCache

if TYPE_CHECKING:
    from ._programs import RedisPrograms

__all__ = ["Appends"]


class Appends:
    """The append program of one store (its prefix, lease length and view cache)."""

    def __init__(self, programs: RedisPrograms, cache: ViewCache | None = None) -> None:
        self.programs = programs
        self.cache = cache if cache is not None else ViewCache()

    def append(self, key: StorageKey, incoming: Sequence[Message], max_messages: int | None,
               lock_timeout: float, idempotency: Idempotency | None = None,
               tail: int = 0, expiry: Expiry | None = None) -> Program[AppendOutcome]:
        """Guess → plan → ``APPLY``; waits for the lease or plans again only when told to.
        With ``tail``, the script replies with the newest ``tail`` entries it left.
        With ``expiry`` (retention), the script drops the conversation first when it
        expired by ``expiry.now`` and gives all its keys the policy's instant.

        Whatever ends it early (an error, a cancellation thrown in by the
        driver), it releases the lease it may hold before re-raising.
        """
        names = self.programs.names(key)
        guess = self.cache.guess(names.meta, sorted(mentioned_ids(incoming)),
                                 needs_pending(incoming),
                                 None if expiry is None else ms(expiry.now))
        if type(incoming) is PerTurn:  # guessed none, checked by the script
            guess = dataclasses.replace(guess, facts=Facts.none(*per_turn_lookups(incoming)))
        token = self.programs.new_token()
        deadline = time.monotonic() + max(lock_timeout, 0.0)
        lease, held, serialized, conflicts = token, False, True, 0
        plan = plan_append(guess.view(), incoming)
        listed = False  # a cluster: whether this append listed the key (past the fence)
        try:
            while True:
                reply = yield from self._apply(key, names, guess, plan, max_messages, lease,
                                               idempotency, tail, listed, expiry)
                if reply[0] == b"unlisted":  # a cluster: list it (past the fence) first
                    yield from self.programs.listed(names, key)
                    listed = True
                    continue
                if reply[0] == b"locked":  # MEM-12: another holder; the bounded wait
                    held = True  # from its first SET NX on, the lease may be this token's
                    held = yield from self.programs.wait(names, token, deadline)
                    if not held:
                        lease, serialized = "", False  # never dropped, still whole
                    continue
                if reply[0] != b"conflict":
                    held = False  # the script released it
                    return (yield from self._done(names, guess, plan, reply, serialized,
                                                  idempotency))
                conflicts += 1
                if time.monotonic() >= deadline:
                    serialized = False  # MEM-12: still never dropped, still whole
                if conflicts > 2:
                    yield Sleep(random.uniform(0, min(POLL_MAX, POLL_START * conflicts)))
                guess = guess.corrected(reply)
                plan = plan_append(guess.view(), incoming)
        except GeneratorExit:
            raise
        except BaseException:
            if held:
                yield from self.programs.release(names, token)
            raise

    def _apply(self, key: StorageKey, names: Names, guess: Guess, plan: AppendPlan,
               max_messages: int | None, lease: str, idempotency: Idempotency | None,
               tail: int, listed: bool, expiry: Expiry | None) -> Program[Any]:
        """One ``EVALSHA`` of ``APPLY``; its reply, but a plain value, a reused
        idempotency key or an erasure's refusal raise (the script released the lease
        already)."""
        programs = self.programs
        record, idem = programs.idem(names, idempotency)
        listing = b""  # a cluster lists the key outside the script (before it)
        if not programs.cluster:
            listing = (b"?" if guess.listed else b"+") + names.member
        elif listed:
            pass
        elif not guess.listed:
            yield from programs.listed(names, key)  # so an acknowledged append is listed
        else:
            listing = b"!"  # listed once, maybe unlisted since: never create it unlisted
        args = [lease, programs.lease_ms, programs.new_token(), SLOT,
                "" if max_messages is None else max_messages, *idem, tail, listing,
                *retention_args(expiry), *guess.args(), *plan_args(plan)]
        reply = yield from script(lua.APPLY, programs.script_keys(names, record), args,
                                  programs.confirm)
        if reply[0] == b"value":
            self.cache.forget(names.meta)
            raise key_conflict(names)
        if reply[0] == b"idem_conflict":
            raise idem_conflict(idempotency)
        if reply[0] == b"erased":
            self.cache.forget(names.meta)
            raise erasure_refusal(key)
        return reply

    def _done(self, names: Names, guess: Guess, plan: AppendPlan, reply: Sequence[Any],
              serialized: bool, idempotency: Idempotency | None) -> Program[AppendOutcome]:
        count, appended, owned = int(reply[1]), int(reply[2]), bool(int(reply[3]))
        serialized = serialized and owned  # fenced: no other token held the lease
        if reply[0] == b"replay":
            return AppendOutcome(count, appended, serialized, replayed=True,
                                 tail=page_of(reply[4]) if reply[4] else None)
        listed = True
        if int(reply[4]) and self.programs.cluster:  # created: a delete or a keys() repair
            listed = yield from self.programs.relisted(names)  # may have unlisted it meanwhile
        self.cache.learn(names.meta, guess, reply[7:], listed=listed,
                         due=int(reply[6]) if reply[6] else None)
        stats = AppendStats(plan.dropped_results, plan.dropped_turns, plan.healed,
                            plan.replaced)
        return AppendOutcome(count, appended, serialized, stats,
                             tail=page_of(reply[5]) if reply[5] else None)
