"""Issue #14: a Redis append is ONE network round trip on the common path, on both faces.

Counted for real: the store talks to Redis through :class:`CountingProxy`, a
TCP proxy that counts request bursts (a pipeline is one burst; every wait for
a reply before sending again is one more). The common append — to a
conversation this store appended to before, nobody else having touched what
it mentions, the MEM-12 lease free — is one ``EVALSHA``; so is the first
append to a new conversation (its key-index ``ZADD`` rides in the same burst)
and an append with an idempotency key, first or replayed.

A second store appending to the same conversation between two appends of the
first makes the first store's guess of the buffer stale only where it matters:
then its script changes nothing and returns the true view, the store plans
again (two round trips) and the history is the pure model's (MEM-1 no
duplicate result, MEM-3 healing, MEM-10 a late result replacing its
placeholder). A random two-writer run with tiny caches checks that a stale or
forgotten guess never makes a wrong decision.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from backends import unavailable
from figures import Figure
from flowmem import ConversationBuffer, Idempotency, StorageKey, append
from flowmem.call_ids import PerTurn
from flowmem.messages import Message
from flowmem.store import AppendOutcome
from flowmem.stores.redis import _view_cache as redis_views
from flowmem.stores.redis._aio import AsyncRedisStore
from flowmem.stores.redis._store import RedisStore
from flowmem.stores.redis._view_cache import ViewCache
from redis_support import (
    CountingProxy,
    msgs,
    result,
    turn,
    url_with,
    user,
)

pytestmark = pytest.mark.skipif(unavailable("redis") is not None,
                                reason=unavailable("redis") or "")


@pytest.fixture
def proxy() -> Iterator[CountingProxy]:
    counting = CountingProxy()
    yield counting
    counting.close()


class Face:
    """One store on the sync or asyncio face, called the same way (a loop of its own)."""

    def __init__(self, face: str, url: str) -> None:
        self.loop = asyncio.new_event_loop() if face == "async" else None
        self.store: Any = (AsyncRedisStore.from_url(url) if self.loop
                           else RedisStore.from_url(url))
        self.call("read", fresh())  # the asyncio face connects and loads its scripts here

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        answer = getattr(self.store, method)(*args, **kwargs)
        return self.loop.run_until_complete(answer) if self.loop else answer

    def append(self, key: StorageKey, batch: list[Message], *, window: int | None = None,
               idempotency: Idempotency | None = None,
               lock_timeout: float = 5.0, tail: int = 0) -> AppendOutcome:
        outcome: AppendOutcome = self.call("append", key, batch, max_messages=window,
                                           lock_timeout=lock_timeout, idempotency=idempotency,
                                           tail=tail)
        return outcome

    def close(self) -> None:
        if self.loop is None:
            self.store.close()
            return
        self.loop.run_until_complete(self.store.aclose())
        self.loop.close()


def fresh() -> StorageKey:
    return StorageKey("workflow", f"rt-{uuid.uuid4().hex}", "conv")


def counted(proxy: CountingProxy, face: Face, key: StorageKey, batch: list[Message],
            **options: Any) -> tuple[int, AppendOutcome]:
    """``(round trips, outcome)`` of one append."""
    before = proxy.round_trips
    outcome = face.append(key, batch, **options)
    return proxy.round_trips - before, outcome


@pytest.mark.parametrize("face_name", ["sync", "async"])
def test_the_common_append_is_one_round_trip(prefix: str, proxy: CountingProxy,
                                             face_name: str) -> None:
    face = Face(face_name, url_with(prefix, proxy.url))
    try:
        key = fresh()
        model: list[Message] = []
        steps: list[tuple[list[Message], int | None, tuple[int, int, int, int]]] = [
            (msgs(user("q")), None, (0, 0, 0, 0)),                # the first append: created
            (msgs(turn("c1", "c2")), None, (0, 0, 0, 0)),
            (msgs(result("c1")), None, (0, 0, 0, 0)),
            (msgs(user("q2")), None, (0, 0, 1, 0)),               # MEM-3 heals c2
            (msgs(result("c2", "late")), None, (0, 0, 0, 1)),     # MEM-10 replaces it
            (msgs(result("c1", "again")), None, (1, 0, 0, 0)),    # MEM-1 dropped
            (msgs(turn("c1")), None, (0, 1, 0, 0)),               # MEM-2 dropped
            (msgs(turn("c3"), result("c3"), user("q3")), 4, (0, 0, 0, 0)),  # evicts
            (msgs(turn("c4"), user("q4")), 4, (0, 0, 1, 0)),      # evicts, heals
            (msgs(result("c4", "late")), 4, (0, 0, 0, 1)),
        ]
        for batch, window, stats in steps:
            trips, outcome = counted(proxy, face, key, batch, window=window)
            expected = append(model, batch, max_messages=window)
            model = expected.messages
            assert trips == 1
            assert (outcome.count, outcome.appended, outcome.serialized) == (
                expected.count, expected.appended, True)
            got = outcome.stats
            assert (got.dropped_results, got.dropped_turns, got.healed, got.replaced) == stats
        assert face.call("read", key) == (True, model)
        # an idempotency key rides in the same script: first and replayed, one round trip
        idem = Idempotency(f"k-{uuid.uuid4().hex}", "fp", 60.0, time.time())
        trips, first = counted(proxy, face, key, msgs(user("once")), idempotency=idem)
        again, replay = counted(proxy, face, key, msgs(user("once")), idempotency=idem)
        assert (trips, again, replay.replayed) == (1, 1, True)
        assert (replay.count, replay.appended) == (first.count, first.appended) == (
            len(model) + 1, 1)
        # the tail (the service's echo) comes back from the same script: still one
        trips, tailed = counted(proxy, face, key, msgs(user("tail")), tail=2)
        assert trips == 1 and tailed.tail is not None
        assert [m["content"] for m in tailed.tail.messages] == ["once", "tail"]
        assert tailed.tail.total == tailed.count
    finally:
        face.close()


def test_per_turn_fresh_ids_are_one_round_trip_a_reused_id_two(
        prefix: str, proxy: CountingProxy) -> None:
    """Under call_ids='per_turn' the facts of a reused id (its newest answered
    declaration, its first declaring turn) are guessed none and checked by the script:
    an agent loop with fresh ids keeps the one round trip; a turn re-declaring an id
    with new arguments, and its result, cost a second (MEM-1/2/10)."""
    face = Face("sync", url_with(prefix, proxy.url))
    try:
        key, model = fresh(), ConversationBuffer(call_ids="per_turn")
        fresh_ids = [msgs(user("q")), msgs(turn("c1")), msgs(result("c1")),
                     msgs(turn("c2"), result("c2"), user("q2"))]
        reused = [msgs(_turn_with("c1", '{"n": 1}')), msgs(result("c1", "second"))]
        for batch, trips_expected in [*((b, 1) for b in fresh_ids), *((b, 2) for b in reused)]:
            expected = model.append(batch)
            trips, outcome = counted(proxy, face, key, PerTurn(batch))
            assert trips == trips_expected
            assert (outcome.count, outcome.appended) == (expected.count, expected.appended)
        assert face.call("read", key) == (True, model.messages)
    finally:
        face.close()


def _turn_with(call: str, arguments: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call, "type": "function", "function": {"name": "f", "arguments": arguments}}]}


@pytest.mark.parametrize("face_name", ["sync", "async"])
def test_a_conflicting_writer_costs_one_more_round_trip_and_never_a_wrong_history(
        prefix: str, proxy: CountingProxy, face_name: str) -> None:
    url = url_with(prefix)
    mine = Face(face_name, url_with(prefix, proxy.url))
    other = RedisStore.from_url(url)  # a second store: its own connections and guesses
    key = fresh()
    model: list[Message] = []

    def theirs(*raw: dict[str, Any]) -> None:
        nonlocal model
        batch = msgs(*raw)
        other.append(key, batch, max_messages=None, lock_timeout=5.0)
        model = append(model, batch).messages

    def ours(*raw: dict[str, Any]) -> tuple[int, AppendOutcome]:
        nonlocal model
        batch = msgs(*raw)
        trips, outcome = counted(proxy, mine, key, batch)
        expected = append(model, batch)
        model = expected.messages
        assert (outcome.count, outcome.appended) == (expected.count, expected.appended)
        return trips, outcome

    try:
        assert ours(user("q"), turn("c1"))[0] == 1
        theirs(result("c1", "from the other worker"))
        trips, outcome = ours(result("c1", "mine"))  # MEM-1: planned again, dropped
        assert (trips, outcome.appended, outcome.stats.dropped_results) == (2, 0, 1)

        assert ours(turn("c2"))[0] == 1
        theirs(turn("c3"))
        trips, outcome = ours(user("next"))  # MEM-3: heals c2 AND the other's c3
        assert (trips, outcome.stats.healed) == (2, 2)

        assert ours(turn("c4"))[0] == 1
        theirs(user("meanwhile"))  # heals c4 with a placeholder
        trips, outcome = ours(result("c4", "late"))  # MEM-10: replaces it in place
        assert (trips, outcome.appended, outcome.stats.replaced) == (2, 0, 1)

        theirs(user("unrelated"))  # touches nothing this store's next append mentions
        assert ours(turn("c5"), result("c5"))[0] == 1
        assert ours(user("after"))[0] == 1  # the guess was corrected: back to one
        assert mine.call("read", key) == (True, model)
    finally:
        mine.close()
        other.close()


@pytest.mark.parametrize("face_name", ["sync", "async"])
def test_mem12_an_append_waits_for_a_live_lease_then_one_script(
        prefix: str, proxy: CountingProxy, face_name: str, figure: Figure) -> None:
    """The script replies ``locked`` (changing nothing) while another token holds the
    lease; the append waits as MEM-12 says, then applies, serialized."""
    url = url_with(prefix)
    face = Face(face_name, url_with(prefix, proxy.url))
    holder = RedisStore.from_url(url)
    key = fresh()
    try:
        face.append(key, msgs(user("q")))
        held = threading.Event()

        def hold() -> None:
            with holder.lock(key, 1.0):
                held.set()
                time.sleep(0.2)

        thread = threading.Thread(target=hold)
        thread.start()
        held.wait(5)
        began = time.perf_counter()
        trips, outcome = counted(proxy, face, key, msgs(user("after the lease")))
        waited = time.perf_counter() - began
        thread.join()
        assert outcome.serialized and outcome.appended == 1
        assert trips >= 3  # locked, the lease polls, the script
        assert face.call("read", key) == (True, msgs(user("q"), user("after the lease")))
        figure(f"\nMEM-12 {face_name}: waited {waited * 1000:.0f} ms for a 200 ms hold, "
              f"{trips} round trips")
    finally:
        face.close()
        holder.close()


def _random_message(rng: random.Random, n: int) -> dict[str, Any]:
    calls = ["c0", "c1", "c2", "c3", "c4", "c5"]
    kind = rng.choice(["user", "turn", "result", "result", "healed", "chat"])
    if kind == "user":
        return user(f"u{n}")
    if kind == "chat":
        return {"role": "assistant", "content": f"a{n}"}
    if kind == "turn":
        return turn(*rng.sample(calls, rng.randint(1, 3)))
    message = result(rng.choice(calls), f"r{n}")
    if kind == "healed":
        message["metadata"] = {"healed": True}
    return message


def test_stale_and_forgotten_guesses_never_decide_wrong(
        prefix: str, monkeypatch: pytest.MonkeyPatch, figure: Figure) -> None:
    """Two stores with tiny caches (one conversation, two ids, two calls) append at
    random to three conversations; every stored buffer stays the pure model's."""
    monkeypatch.setattr(redis_views, "CACHED_IDS", 2)
    monkeypatch.setattr(redis_views, "CACHED_PENDING", 2)
    corrections = [0]
    real = redis_views.Guess.corrected

    def corrected(guess: redis_views.Guess, reply: Any) -> redis_views.Guess:
        corrections[0] += 1
        return real(guess, reply)

    monkeypatch.setattr(redis_views.Guess, "corrected", corrected)
    seed = 20261203  # fixed: a failure reproduces; the figure names it
    rng = random.Random(seed)
    url = url_with(prefix)
    writers = [RedisStore.from_url(url), RedisStore.from_url(url)]
    for writer in writers:
        writer.programs.appends.cache = ViewCache(buffers=1)
    keys = [fresh() for _ in range(3)]
    models: dict[StorageKey, list[Message]] = {key: [] for key in keys}
    try:
        for n in range(300):
            key, writer = rng.choice(keys), rng.choice(writers)
            window = rng.choice([None, 6])
            batch = msgs(*[_random_message(rng, n) for _ in range(rng.randint(1, 3))])
            outcome = writer.append(key, batch, max_messages=window, lock_timeout=5.0)
            expected = append(models[key], batch, max_messages=window)
            models[key] = expected.messages
            assert (outcome.count, outcome.appended) == (expected.count, expected.appended), seed
            assert writer.read(key) == (True, models[key]), seed
        figure(f"\nRedis guesses (seed {seed}): 300 appends, {corrections[0]} corrected")
        assert corrections[0] > 10  # the re-plan path really ran
    finally:
        for writer in writers:
            writer.close()
