"""Writers and the audit shared by the MEM-12 tests (contention, forced fallback).

Each writer appends its own deterministic sequence of turns to ONE shared
conversation, one message per append, in a cycle of four::

    assistant declaring call "w<writer>-c<n>"
    tool result for that call
    the SAME tool result again (a re-fire: MEM-1 drops it, ``appended == 0``)
    user turn "w<writer>-u<n>"

Another writer's user turn may heal this writer's open call first (MEM-3); the
real result then replaces the placeholder in place (MEM-10). Either way, at
the end every unique turn must be in the buffer exactly once, in its writer's
order, and no placeholder must remain.

This module has no test in it: the spawned processes import it by name.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from flowmem import ExecutionContext
from flowmem.memory import Memory

SCOPE = "session"
KEY = "conversation"
CONTEXT = ExecutionContext(session_id="mem12-shared", node_id="n", pipeline_id="p",
                           workflow_id="w")


def turn(writer: int, index: int) -> tuple[str, dict[str, Any]]:
    """``(identity, message)`` of ``writer``'s append number ``index``."""
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
    """The identities ``writer`` must leave in the buffer, in its order."""
    seen: list[str] = []
    for identity, _ in turns(writer, appends):
        if identity not in seen:
            seen.append(identity)
    return seen


@dataclass
class WriterStats:
    writer: int
    appends: int = 0
    appended: int = 0
    refires_appended: int = 0  # must stay 0 (MEM-1)
    placeholders_replaced: int = 0  # a first result that found its call healed (MEM-10)
    fallbacks: int = 0  # appends that reported serialized=False (MEM-12)
    errors: list[str] = field(default_factory=list)


def run_writer(memory: Memory, writer: int, appends: int,
               barrier: Any = None, pause: float = 0.0) -> WriterStats:
    """Append ``writer``'s sequence; never raises (errors are collected).

    ``pause`` seconds between appends let other writers in (a process that
    just released the lock would otherwise often take it straight back).
    """
    stats = WriterStats(writer)
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
        stats.fallbacks += not getattr(result, "serialized", True)
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
    """A spawned process: open its own store, write, report its stats."""
    memory = Memory.from_url(url, lock_timeout=lock_timeout)
    try:
        stats = run_writer(memory, writer, appends, barrier, pause)
    finally:
        memory.close()
    queue.put(stats)


def thread_writers(memory: Memory, writers: int, appends: int) -> list[WriterStats]:
    """``writers`` threads over one ``Memory``, started together."""
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


def identity_of(message: dict[str, Any]) -> str:
    metadata = message.get("metadata") or {}
    if message["role"] == "assistant":
        return "a:" + ",".join(c.get("id") or c.get("tool_call_id")
                               for c in metadata.get("tool_calls", []))
    if message["role"] == "tool":
        prefix = "h:" if metadata.get("healed") else "t:"
        return prefix + str(metadata.get("tool_call_id"))
    return f"u:{message['content']}"


def interleavings(messages: list[dict[str, Any]]) -> int:
    """How often consecutive entries come from different writers."""
    writers = [identity_of(m).split(":", 1)[1].split("-", 1)[0] for m in messages]
    return sum(1 for a, b in pairwise(writers) if a != b)


@dataclass
class Audit:
    expected: int
    stored: int
    lost: int
    duplicates: int
    order_violations: int
    placeholders: int
    wrong_content: int

    def line(self) -> str:
        return (f"expected turns {self.expected}, stored {self.stored}, lost {self.lost}, "
                f"duplicates {self.duplicates}, order violations {self.order_violations}, "
                f"placeholders left {self.placeholders}, wrong content {self.wrong_content}")


def audit(messages: list[dict[str, Any]], writers: list[int], appends: int) -> Audit:
    """Compare the final buffer with what the writers sent."""
    identities = [identity_of(m) for m in messages]
    counts = Counter(identities)
    position = {identity: i for i, identity in enumerate(identities)}
    expected = 0
    lost = order = 0
    for writer in writers:
        mine = unique_turns(writer, appends)
        expected += len(mine)
        lost += sum(1 for identity in mine if identity not in counts)
        present = [position[identity] for identity in mine if identity in position]
        order += sum(1 for a, b in pairwise(present) if a > b)
    wrong = 0
    for message, identity in zip(messages, identities, strict=True):
        if identity.startswith("t:") and message["content"] != f"result of {identity[2:]}":
            wrong += 1
    return Audit(
        expected=expected, stored=len(messages), lost=lost,
        duplicates=sum(c - 1 for c in counts.values() if c > 1),
        order_violations=order,
        placeholders=sum(1 for identity in identities if identity.startswith("h:")),
        wrong_content=wrong,
    )


def hold_lock(url: str, held: Any, release: Any, had: Any) -> None:
    """A spawned process: take the shared buffer's MEM-12 lock and keep it until told."""
    from flowmem.scopes import StorageKey, resolve_scope
    from flowmem.stores import open_store

    store = open_store(url)
    key = StorageKey(SCOPE, resolve_scope(SCOPE, CONTEXT), KEY)
    try:
        with store.lock(key, 5.0) as got:
            had.value = int(got)
            held.set()
            release.wait(60)
    finally:
        store.close()
