"""A Redis Cluster failover under load: kill -9 of a master while writers append.

A private cluster of 3 masters and 3 replicas (``cluster-node-timeout`` 1 s).
Four writer threads, each with its own store from one plain node URL with
``wait_replicas=1`` (an append is acknowledged once a replica confirmed it),
append numbered turns to eight conversations (``random.Random(seed)`` picks
them), each with an idempotency key. Mid-load one master's process is killed
with SIGKILL; once its replica has taken over, the killed node is started
again (it rejoins as that new master's replica: until then the shard has no
replica to confirm anything). An append that fails says which of two things
happened:

* ``StoreUnavailable`` "… nothing was changed …" (CLUSTERDOWN, TRYAGAIN, a slot
  still moving): not stored — the writer moves on, and the test checks the
  turn is indeed absent;
* any other ``StoreUnavailable`` — the connection dropped or timed out, or
  :class:`~flowmem.errors.OutcomeUnknown` (a subclass): stored on a primary
  but not confirmed by a replica: it may have been stored — the writer retries
  with the SAME idempotency key until acknowledged, and the test checks it is
  stored once.

Then: every acknowledged turn is stored exactly once (0 lost, 0 duplicates),
no turn reported "nothing was changed" is stored, the longest stretch of
errors a writer saw is bounded, and the same store objects resume without a
manual step once the replica has taken over. Without ``wait_replicas`` a
loaded machine lost acknowledged turns here: replication is asynchronous, and
a replica that lagged (or a failover of a stalled master) dropped them.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from figures import Figure
from flowmem import Idempotency, StorageKey
from flowmem.errors import OutcomeUnknown, StoreUnavailable
from flowmem.messages import canonical_messages
from flowmem.stores.redis import RedisStore
from redis_cluster import PrivateCluster, cluster_unavailable, start_cluster

pytestmark = [pytest.mark.redis, pytest.mark.processes,
              pytest.mark.skipif(cluster_unavailable() is not None,
                                 reason=cluster_unavailable() or ""),
              pytest.mark.xdist_group("test_redis_cluster_failover")]

SEED, WRITERS, KEYS, BEFORE_KILL, AFTER_KILL = 20240611, 4, 8, 60, 120
NOT_CHANGED = "nothing was changed"


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    started = start_cluster(replicas=1)
    yield started
    started.stop()


@dataclass
class Writer:
    acked: list[str] = field(default_factory=list)
    not_stored: list[str] = field(default_factory=list)
    retried: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    longest_outage: float = 0.0
    unexpected: list[str] = field(default_factory=list)
    unconfirmed: int = 0


def test_kill_a_master_mid_load(cluster: PrivateCluster, figure: Figure) -> None:
    url = f"{cluster.url}?prefix=fmf-{uuid.uuid4().hex[:8]}&wait_replicas=1"
    scope_id = f"f-{uuid.uuid4().hex[:8]}"
    keys = [StorageKey("workflow", scope_id, f"c{n}") for n in range(KEYS)]
    rng = random.Random(SEED)
    plans = [[rng.randrange(KEYS) for _ in range(10_000)] for _ in range(WRITERS)]
    acked_total = threading.Semaphore(0)
    killed = threading.Event()
    stop = threading.Event()
    writers = [Writer() for _ in range(WRITERS)]

    def write(w: int) -> None:
        me, store = writers[w], RedisStore.from_url(url)
        try:
            for i, k in enumerate(plans[w]):
                if stop.is_set():
                    return
                turn = f"w{w}-{i}"
                idem = Idempotency(f"{turn}-{scope_id}", "fp", 600.0, time.time())
                message = canonical_messages([{"role": "user", "content": turn}])
                failing_since: float | None = None
                while True:
                    try:
                        store.append(keys[k], message, max_messages=None, lock_timeout=5.0,
                                     idempotency=idem)
                    except StoreUnavailable as exc:
                        failing_since = failing_since or time.monotonic()
                        me.longest_outage = max(me.longest_outage,
                                                time.monotonic() - failing_since)
                        if me.longest_outage > 30:
                            me.unexpected.append(f"{turn}: still failing: {exc}")
                            return
                        me.errors[str(exc).split(":")[0]] += 1
                        me.unconfirmed += (isinstance(exc, OutcomeUnknown)
                                           and "did not confirm" in str(exc))
                        if NOT_CHANGED in str(exc):
                            me.not_stored.append(turn)
                            break
                        me.retried += 1  # may have been stored: the same key again
                        time.sleep(0.01)
                        continue
                    except Exception as exc:  # anything else fails the test
                        me.unexpected.append(f"{turn}: {type(exc).__name__}: {exc}")
                        return
                    me.acked.append(turn)
                    acked_total.release()
                    break
        finally:
            store.close()

    threads = [threading.Thread(target=write, args=(w,)) for w in range(WRITERS)]
    for thread in threads:
        thread.start()
    for _ in range(BEFORE_KILL):
        assert acked_total.acquire(timeout=60), "no progress before the kill"
    victim = rng.choice(cluster.masters())
    cluster.kill(victim)
    killed.set()
    cluster.wait_ok(timeout=60, masters=3, replaced=victim)  # a replica took over
    resumed_at = time.monotonic()
    cluster.restart(victim)  # back as the new master's replica: its shard confirms again
    for _ in range(AFTER_KILL):
        assert acked_total.acquire(timeout=60), "appends did not resume after the failover"
    stop.set()
    for thread in threads:
        thread.join(timeout=60)

    check = RedisStore.from_url(f"redis://127.0.0.1:"
                                f"{next(p for p in cluster.ports if p != victim)}/0"
                                f"?{url.partition('?')[2]}")
    try:
        stored = Counter(m["content"] for key in keys for m in (check.read(key)[1] or []))
        listed = check.keys("workflow", scope_id)
    finally:
        check.close()
    acked = [t for w in writers for t in w.acked]
    not_stored = [t for w in writers for t in w.not_stored]
    errors = sum((w.errors for w in writers), Counter())
    outage = max(w.longest_outage for w in writers)
    figure(f"\nfailover: killed master :{victim}; acknowledged {len(acked)}, stored "
          f"{sum(stored.values())}, reported not stored {len(not_stored)}, retried with "
          f"the same key {sum(w.retried for w in writers)} (not confirmed by a replica "
          f"{sum(w.unconfirmed for w in writers)}), longest outage a writer saw "
          f"{outage:.2f} s; errors {dict(errors)}; resumed "
          f"{time.monotonic() - resumed_at:.2f} s after cluster_state:ok")
    assert [u for w in writers for u in w.unexpected] == []
    assert [t for t in acked if stored[t] == 0] == []          # 0 acknowledged lost
    assert [t for t, n in stored.items() if n > 1] == []       # 0 duplicates
    assert [t for t in not_stored if stored[t]] == []          # 0 stored while reported failed
    assert set(stored) <= set(acked)                           # nothing else stored
    assert outage < 15.0                                       # bounded
    assert sorted(listed) == sorted({k.key for k in keys})
