"""The one MEM-12 contention harness: workloads, writers, acknowledgements, the audit.

Every backend's contention and fault tests (SQLite, PostgreSQL, Redis) use
it with their own store URL, so what counts as lost, doubled, torn or
reordered is decided once, here. Two workloads:

``cycle`` — one message per append, a cycle of four per writer::

    assistant declaring call "w<writer>-c<n>"
    tool result for that call
    the SAME tool result again (a re-fire: MEM-1 drops it, ``appended == 0``)
    user turn "w<writer>-u<n>"

  Another writer's user turn may heal this writer's open call first (MEM-3);
  the real result then replaces the placeholder in place (MEM-10).

``batch`` — one turn per append: (every 10th with a user turn first) an
  assistant declaring ``"<writer>:<i>"``, its result, and from the second on
  the result of an earlier call re-fired (MEM-1 must drop it), so each turn
  lands whole and contiguous.

The audit compares a stored buffer with what each writer must have left in
it, in its order. Writers with an ack log record ``S id`` before an append,
``A id`` after it returned and ``E id Error`` when it raised, each with one
unbuffered ``O_APPEND`` write, so a kill -9 loses no acknowledgement; a test
may append its own marks (``D`` for "the database was deleted here").

This module has no test in it: spawned processes import it by name.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from flowmem import ExecutionContext
from flowmem.memory import Memory
from flowmem.stores import open_store

SCOPE = "session"
KEY = "conversation"
CONTEXT = ExecutionContext(session_id="mem12-shared", node_id="n", pipeline_id="p",
                           workflow_id="w")


# -- the cycle workload (one message per append) ---------------------------------------
def turn(writer: int, index: int) -> tuple[str, dict[str, Any]]:
    """``(identity, message)`` of ``writer``'s append number ``index`` (cycle workload)."""
    n, step = divmod(index, 4)
    call = f"w{writer}-c{n}"
    if step == 0:
        return f"a:{call}", {"role": "assistant", "content": None, "tool_calls": [
            {"id": call, "type": "function",
             "function": {"name": "lookup", "arguments": f'{{"n": {n}}}'}}]}
    if step in (1, 2):
        return f"t:{call}", {"role": "tool", "tool_call_id": call,
                             "content": f"result of {call}"}
    return f"u:w{writer}-u{n}", {"role": "user", "content": f"w{writer}-u{n}"}


def turns(writer: int, appends: int) -> list[tuple[str, dict[str, Any]]]:
    """``(identity, message)`` for each append of ``writer``; re-fires repeat an identity."""
    return [turn(writer, i) for i in range(appends)]


def unique_turns(writer: int, appends: int) -> list[str]:
    """The identities a cycle writer must leave in the buffer, in its order."""
    seen: list[str] = []
    for identity, _ in turns(writer, appends):
        if identity not in seen:
            seen.append(identity)
    return seen


def cycle_expected(writers: Sequence[int], appends: int) -> dict[str, list[str]]:
    return {str(w): unique_turns(w, appends) for w in writers}


# -- the batch workload (one whole turn per append) ------------------------------------
def batch(writer: str, i: int, refire: int | None = None,
          user: bool = False) -> list[dict[str, Any]]:
    """Append ``i`` of ``writer``: [user turn], assistant declaring ``writer:i``, its
    result, and the result of ``writer:refire`` re-fired (MEM-1 must drop it)."""
    call = f"{writer}:{i}"
    out: list[dict[str, Any]] = []
    if user:
        out.append({"role": "user", "content": call})
    out += [{"role": "assistant", "content": None,
             "tool_calls": [{"id": call, "type": "function",
                             "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": call, "content": f"result of {call}"}]
    if refire is not None:
        earlier = f"{writer}:{refire}"
        out.append({"role": "tool", "tool_call_id": earlier, "content": f"re-fired {earlier}"})
    return out


def batch_identities(writer: str, i: int, user: bool = False) -> list[str]:
    """What ``batch(writer, i, …, user)`` leaves in the buffer."""
    call = f"{writer}:{i}"
    return [f"u:{call}"] * user + [f"a:{call}", f"t:{call}"]


def standard_batch(writer: str, i: int) -> list[dict[str, Any]]:
    """The contention batch: a user turn every 10th, the result of ``i // 2`` re-fired."""
    return batch(writer, i, refire=i // 2 if i else None, user=i % 10 == 0)


def standard_expected(writers: Sequence[str], appends: int) -> dict[str, list[str]]:
    return {w: [x for i in range(appends) for x in batch_identities(w, i, i % 10 == 0)]
            for w in writers}


# -- the audit ------------------------------------------------------------------------
def identity_of(message: dict[str, Any]) -> str:
    """``a:<calls>``, ``t:<call>`` (a result), ``h:<call>`` (a healed placeholder), ``u:<text>``."""
    metadata = message.get("metadata") or {}
    if message["role"] == "assistant":
        return "a:" + ",".join(c.get("id") or c.get("tool_call_id")
                               for c in metadata.get("tool_calls", []))
    if message["role"] == "tool":
        prefix = "h:" if metadata.get("healed") else "t:"
        return prefix + str(metadata.get("tool_call_id"))
    return f"u:{message['content']}"


def writer_of(identity: str) -> str:
    rest = identity.split(":", 1)[1]
    return rest.rsplit(":", 1)[0] if ":" in rest else rest.split("-", 1)[0]


def interleavings(messages: list[dict[str, Any]]) -> int:
    """How often consecutive entries come from different writers."""
    writers = [writer_of(identity_of(m)) for m in messages]
    return sum(1 for a, b in pairwise(writers) if a != b)


@dataclass
class Audit:
    expected: int
    stored: int
    lost: int
    duplicates: int
    order_violations: int
    torn: int
    placeholders: int
    wrong_content: int
    turns: int

    def line(self) -> str:
        return (f"expected {self.expected}, stored {self.stored} ({self.turns} turns), lost "
                f"{self.lost}, duplicates {self.duplicates}, order violations "
                f"{self.order_violations}, torn turns {self.torn}, placeholders left "
                f"{self.placeholders}, wrong content {self.wrong_content}")


def audit(messages: Sequence[dict[str, Any]], expected: Mapping[str, Sequence[str]]) -> Audit:
    """Compare a stored buffer with the entries each writer must have left, in order.

    ``lost``: expected entries not stored; ``duplicates``: entries stored
    twice; ``order_violations``: a writer's entries out of its order;
    ``torn``: an assistant turn not directly followed by its result;
    ``placeholders``: healed results left; ``wrong_content``: a result that
    is not the one its writer sent first.
    """
    identities = [identity_of(m) for m in messages]
    counts = Counter(identities)
    position = {identity: i for i, identity in enumerate(identities)}
    total = lost = order = 0
    for mine in expected.values():
        total += len(mine)
        lost += sum(1 for identity in mine if identity not in counts)
        present = [position[identity] for identity in mine if identity in position]
        order += sum(1 for a, b in pairwise(present) if a > b)
    torn = wrong = 0
    for index, (message, identity) in enumerate(zip(messages, identities, strict=True)):
        if identity.startswith("t:") and message["content"] != f"result of {identity[2:]}":
            wrong += 1
        if identity.startswith("a:") and "," not in identity:
            following = identities[index + 1][2:] if index + 1 < len(identities) else None
            torn += following != identity[2:]
    return Audit(expected=total, stored=len(messages), lost=lost,
                 duplicates=sum(c - 1 for c in counts.values() if c > 1),
                 order_violations=order, torn=torn,
                 placeholders=sum(1 for identity in identities if identity.startswith("h:")),
                 wrong_content=wrong,
                 turns=len({i for i in identities if i.startswith("a:")}))


# -- writers ---------------------------------------------------------------------------
@dataclass
class WriterStats:
    writer: str
    appends: int = 0
    appended: int = 0
    refires_appended: int = 0  # must stay 0 (MEM-1)
    placeholders_replaced: int = 0  # a first result that found its call healed (MEM-10)
    fallbacks: int = 0  # appends that reported serialized=False (MEM-12)
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)


def run_writer(memory: Memory, writer: int, appends: int,
               barrier: Any = None, pause: float = 0.0) -> WriterStats:
    """Append ``writer``'s cycle; never raises (errors are collected).

    ``pause`` seconds between appends let other writers in (a process that
    just released the lock would otherwise often take it straight back).
    """
    stats = WriterStats(str(writer))
    sent: set[str] = set()
    if barrier is not None:
        barrier.wait()
    for identity, message in turns(writer, appends):
        try:
            result = memory.append(SCOPE, KEY, message, context=CONTEXT)
        except Exception as exc:  # a lost turn: reported, not raised
            stats.errors.append(f"{identity}: {type(exc).__name__}: {exc}")
            continue
        stats.appends += 1
        stats.appended += result.appended
        stats.fallbacks += not result.serialized
        if identity in sent:
            stats.refires_appended += result.appended
        elif identity.startswith("t:") and result.appended == 0:
            stats.placeholders_replaced += 1
        sent.add(identity)
        if pause:
            time.sleep(pause)
    return stats


def process_writer(url: str, writer: int, appends: int, barrier: Any, queue: Any,
                   lock_timeout: float, pause: float = 0.0) -> None:
    """A spawned process: open its own store, write a cycle, report its stats."""
    memory = Memory.from_url(url, lock_timeout=lock_timeout)
    try:
        stats = run_writer(memory, writer, appends, barrier, pause)
    finally:
        memory.close()
    queue.put(stats)


def thread_writers(memory: Memory, writers: int, appends: int) -> list[WriterStats]:
    """``writers`` cycle threads over one ``Memory``, started together."""
    barrier = threading.Barrier(writers)
    results: list[WriterStats | None] = [None] * writers

    def body(w: int) -> None:
        results[w] = run_writer(memory, w, appends, barrier)

    threads = [threading.Thread(target=body, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a writer thread hung"
    return [r for r in results if r is not None]


def write_batches(memory: Memory, writer: str, appends: int, key: str = KEY,
                  context: ExecutionContext = CONTEXT) -> WriterStats:
    """``appends`` standard batches of ``writer``; never raises (errors are collected)."""
    stats = WriterStats(writer)
    began = time.perf_counter()
    for i in range(appends):
        try:
            result = memory.append(SCOPE, key, standard_batch(writer, i), context=context)
        except Exception as exc:  # reported, not raised: a lost turn fails the audit
            stats.errors.append(f"{writer}:{i}: {type(exc).__name__}: {exc}")
            continue
        stats.appends += 1
        stats.appended += result.appended
        stats.fallbacks += not result.serialized
    stats.seconds = time.perf_counter() - began
    return stats


def batch_process(url: str, name: str, threads: int, appends: int, barrier: Any,
                  queue: Any) -> None:
    """A spawned process: its own ``Memory``, ``threads`` batch writers ``<name>t<n>``,
    their summed stats (``seconds``: the slowest) to ``queue``."""
    memory = Memory.from_url(url)
    results: list[WriterStats] = []
    try:
        memory.read(SCOPE, KEY, context=CONTEXT)  # connected before the clock starts
        barrier.wait()
        workers = [threading.Thread(target=lambda w=f"{name}t{t}": results.append(
            write_batches(memory, w, appends))) for t in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        memory.close()
    queue.put(WriterStats(name, sum(s.appends for s in results),
                          sum(s.appended for s in results), 0, 0,
                          sum(s.fallbacks for s in results),
                          max((s.seconds for s in results), default=0.0),
                          [e for s in results for e in s.errors]))


def ack_writer(url: str, name: str, keys: Sequence[str], session: str, threads: int,
               per_thread: int | None, ack_path: str | None, ready: Any, stop: Any) -> None:
    """A process with its own :class:`Memory` appending batches to shared conversations.

    Turn ``i`` of thread ``t`` goes to ``keys[i % len(keys)]`` and re-fires the
    thread's previous turn in that key. With ``ack_path`` each append is
    logged (``S``, then ``A`` or ``E``). ``per_thread=None`` runs until
    ``stop`` is set; an append that raises is logged and the writer goes on.
    """
    memory = Memory.from_url(url, lock_timeout=5.0)
    context = ExecutionContext(session_id=session)
    fd = os.open(ack_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) if ack_path else None
    guard = threading.Lock()
    memory.read(SCOPE, keys[0], context=context)  # connected

    def log(line: str) -> None:
        if fd is not None:
            with guard:
                os.write(fd, line.encode())

    def writer(t: int) -> None:
        tag = f"{name}t{t}"
        i = 0
        while (per_thread is None and not stop.is_set()) or (per_thread is not None
                                                             and i < per_thread):
            key = keys[i % len(keys)]
            earlier = i - len(keys)  # the previous turn of this thread in the same key
            log(f"S {tag}:{i} {key}\n")
            try:
                memory.append(SCOPE, key, batch(tag, i, earlier if earlier >= 0 else None),
                              context=context)
            except Exception as exc:
                if fd is None:
                    raise
                log(f"E {tag}:{i} {key} {type(exc).__name__}\n")
                time.sleep(0.001)
            else:
                log(f"A {tag}:{i} {key}\n")
            i += 1

    workers = [threading.Thread(target=writer, args=(t,)) for t in range(threads)]
    ready.set()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    try:
        memory.close()
    finally:
        if fd is not None:
            os.close(fd)


@dataclass
class AckLog:
    """What an ack log says: per key the acknowledged call ids, and what came after a mark."""

    acked: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    in_flight: int = 0  # started, neither acknowledged nor failed (a kill)
    errors: Counter[str] = field(default_factory=Counter)
    started_after_mark: set[str] = field(default_factory=set)
    acked_after_mark: set[str] = field(default_factory=set)  # returned after the mark
    failed_after_mark: set[str] = field(default_factory=set)

    def all_acked(self) -> set[str]:
        return set().union(*self.acked.values()) if self.acked else set()


def read_acks(path: str) -> AckLog:
    """Parse an ack log written by :func:`ack_writer` (and the test's ``D`` marks)."""
    log = AckLog()
    started: set[str] = set()
    done: set[str] = set()
    marked = False
    if not os.path.exists(path):
        return log
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            parts = line.split()
            if parts == ["D"]:
                marked = True
                continue
            if len(parts) < 3 or (parts[0] == "E" and len(parts) != 4):
                continue  # a line cut by a kill
            mark, call, key = parts[:3]
            if mark == "S":
                started.add(call)
                if marked:
                    log.started_after_mark.add(call)
            elif mark == "A":
                log.acked[key].add(call)
                done.add(call)
                if marked:
                    log.acked_after_mark.add(call)
            elif mark == "E":
                log.errors[parts[3]] += 1
                done.add(call)
                if marked:
                    log.failed_after_mark.add(call)
    log.in_flight = len(started - done)
    return log


def batch_expected(calls: set[str]) -> dict[str, list[str]]:
    """Per writer, the entries of the batch turns ``calls`` (``writer:i``), in order."""
    by_writer: dict[str, list[int]] = defaultdict(list)
    for call in calls:
        writer, _, number = call.rpartition(":")
        by_writer[writer].append(int(number))
    return {w: [x for i in sorted(ns) for x in batch_identities(w, i)]
            for w, ns in by_writer.items()}


# -- opening and locks ---------------------------------------------------------------
def open_at_once(urls: Sequence[str], threads: int, barrier: Any, results: Any) -> None:
    """For each URL in turn: when every process is at the barrier, open (and so create or
    migrate) the store from ``threads`` threads at once, write, read and close. Errors
    go to ``results`` as one list (the opens that failed)."""
    errors: list[str] = []
    guard = threading.Lock()
    for round_, url in enumerate(urls):
        start = threading.Barrier(threads)

        def opener(t: int, url: str = url, round_: int = round_,
                   start: threading.Barrier = start) -> None:
            start.wait()
            try:
                memory = Memory.from_url(url)
                try:
                    context = ExecutionContext(session_id=f"open-{os.getpid()}-{t}")
                    memory.write(SCOPE, f"r{round_}", t, context=context)
                    assert memory.read(SCOPE, f"r{round_}", context=context).value == t
                finally:
                    memory.close()
            except Exception as exc:  # reported to the parent
                with guard:
                    errors.append(f"{type(exc).__name__}: {exc}")

        workers = [threading.Thread(target=opener, args=(t,)) for t in range(threads)]
        barrier.wait()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    results.put(errors)


def hold_lock(url: str, held: Any, release: Any, had: Any) -> None:
    """A spawned process: take the shared buffer's MEM-12 lock and keep it until told."""
    from flowmem.scopes import StorageKey, resolve_scope

    store = open_store(url)
    key = StorageKey(SCOPE, resolve_scope(SCOPE, CONTEXT), KEY)
    try:
        with store.lock(key, 5.0) as got:
            had.value = int(got)
            held.set()
            release.wait(60)
    finally:
        store.close()

