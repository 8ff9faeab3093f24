"""Helpers of the PostgreSQL tests: a throw-away schema, writer processes, the figures.

Writer functions live here (not in the test modules) so ``spawn`` children
import them without importing pytest test modules. Every writer appends
turns ``[assistant declaring "<writer>:<i>", its result]`` — plus, from the
second on, the result of an earlier turn re-fired (MEM-1 must drop it) — so
the stored buffer tells exactly what was lost, doubled, torn or reordered.
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from backends import POSTGRES_URL
from flowmem import ExecutionContext
from flowmem.ids import declared_call_ids, result_id
from flowmem.memory import Memory
from flowmem.messages import Message, canonical_messages
from flowmem.scopes import StorageKey
from flowmem.stores import open_store

if TYPE_CHECKING:  # psycopg is imported only when a PostgreSQL test runs
    import psycopg


def with_options(url: str, **options: Any) -> str:
    """``url`` with query options added or replaced."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    query.update({name: str(value) for name, value in options.items()})
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), ""))


def admin() -> psycopg.Connection[tuple[Any, ...]]:
    """A plain autocommit connection to the test database (no flowmem options)."""
    import psycopg

    parts = urlsplit(POSTGRES_URL)
    plain = [(k, v) for k, v in parse_qsl(parts.query)
             if k not in ("schema", "pool_min", "pool_max", "pool_timeout",
                          "statement_timeout")]
    return psycopg.connect(urlunsplit((parts.scheme, parts.netloc, parts.path,
                                       urlencode(plain), "")), autocommit=True)


@contextmanager
def throwaway_schema(tag: str) -> Iterator[tuple[str, str]]:
    """``(url, schema)`` of a schema unique to this run, dropped afterwards."""
    schema = f"flowmem_test_{os.getpid()}_{tag}"
    try:
        yield with_options(POSTGRES_URL, schema=schema), schema
    finally:
        with admin() as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def turn(writer: str, i: int, refire: int | None = None) -> list[Message]:
    """One append of a writer: its turn ``i``, its result, and a re-fired earlier result."""
    call = f"{writer}:{i}"
    batch: list[Message] = [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": call, "type": "function",
                         "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": call, "content": f"result {call}"},
    ]
    if refire is not None:
        batch.append({"role": "tool", "tool_call_id": f"{writer}:{refire}",
                      "content": "re-fired"})
    return batch


@dataclass
class Figures:
    """What a shared buffer tells about its writers' turns."""

    stored_turns: int
    lost: int
    duplicates: int
    torn: int
    order_violations: int
    healed: int

    def line(self) -> str:
        return (f"stored turns {self.stored_turns}, lost {self.lost}, duplicates "
                f"{self.duplicates}, torn {self.torn}, order violations "
                f"{self.order_violations}, healed {self.healed}")


def figures(messages: Sequence[Message], expected: Iterable[str]) -> Figures:
    """Lost (expected turns not stored whole), doubled, torn, reordered turns."""
    declared: list[str] = []
    results: list[str] = []
    torn = healed = 0
    for index, message in enumerate(messages):
        ids = declared_call_ids(message)
        declared.extend(ids)
        answered = result_id(message)
        if answered is not None:
            results.append(answered)
            healed += bool(message.get("metadata", {}).get("healed"))
        if ids:
            following = messages[index + 1] if index + 1 < len(messages) else None
            if following is None or result_id(following) != ids[0]:
                torn += 1
    whole = set(declared) & set(results)
    lost = len(set(expected) - whole)
    duplicates = (len(declared) - len(set(declared))) + (len(results) - len(set(results)))
    last: dict[str, int] = defaultdict(lambda: -1)
    violations = 0
    for call in declared:
        writer, _, number = call.rpartition(":")
        if int(number) <= last[writer]:
            violations += 1
        last[writer] = int(number)
    return Figures(len(set(declared)), lost, duplicates, torn, violations, healed)


# -- processes -------------------------------------------------------------------------
def contention_process(url: str, key: tuple[str, str, str], proc: int, threads: int,
                       per_thread: int, barrier: Any, results: Any) -> None:
    """Threads of one process appending to ONE buffer through the store."""
    store = open_store(with_options(url, pool_max=threads, pool_min=threads))
    where = StorageKey(*key)
    fallbacks = [0] * threads
    start = threading.Barrier(threads)

    def writer(t: int) -> None:
        name = f"p{proc}t{t}"
        rng = random.Random(f"{proc}-{t}")
        start.wait()
        for i in range(per_thread):
            refire = rng.randrange(i) if i else None
            outcome = store.append(where, canonical_messages(turn(name, i, refire)),
                                   max_messages=None, lock_timeout=10.0)
            fallbacks[t] += not outcome.serialized

    workers = [threading.Thread(target=writer, args=(t,)) for t in range(threads)]
    store.read(where)  # connect before the clock starts
    barrier.wait()
    began = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    results.put((proc, time.perf_counter() - began, sum(fallbacks)))
    store.close()


def memory_writer(url: str, name: str, keys: Sequence[str], session: str, threads: int,
                  per_thread: int | None, ack_path: str | None, ready: Any,
                  stop: Any) -> None:
    """A process with its own :class:`Memory` appending to shared conversations.

    Turn ``i`` of thread ``t`` goes to ``keys[i % len(keys)]``. With
    ``ack_path``, each append is recorded (``S id`` before the call, ``A id``
    after it returned) with an unbuffered ``O_APPEND`` write, so a kill -9
    loses no acknowledgement. ``per_thread=None`` runs until ``stop`` is set.
    """
    memory = Memory.from_url(with_options(url, pool_max=threads), lock_timeout=5.0)
    context = ExecutionContext(session_id=session)
    fd = os.open(ack_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) if ack_path else None
    guard = threading.Lock()
    memory.read("session", keys[0], context=context)  # connected

    def writer(t: int) -> None:
        tag = f"{name}t{t}"
        i = 0
        while (per_thread is None and not stop.is_set()) or (per_thread is not None
                                                             and i < per_thread):
            key = keys[i % len(keys)]
            earlier = i - len(keys)  # the previous turn of this thread in the same key
            refire = earlier if earlier >= 0 else None
            if fd is not None:
                with guard:
                    os.write(fd, f"S {tag}:{i} {key}\n".encode())
            memory.append("session", key, turn(tag, i, refire), context=context)
            if fd is not None:
                with guard:
                    os.write(fd, f"A {tag}:{i} {key}\n".encode())
            i += 1

    workers = [threading.Thread(target=writer, args=(t,)) for t in range(threads)]
    ready.set()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    memory.close()


def acknowledged(path: str) -> tuple[dict[str, set[str]], int]:
    """Per key, the ids whose append returned; and how many were started but not acked."""
    acked: dict[str, set[str]] = defaultdict(set)
    started: set[str] = set()
    done: set[str] = set()
    if not os.path.exists(path):
        return acked, 0
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            parts = line.split()
            if len(parts) != 3:
                continue  # a line cut by the kill
            mark, call, key = parts
            if mark == "A":
                acked[key].add(call)
                done.add(call)
            else:
                started.add(call)
    return acked, len(started - done)


def unique_session() -> str:
    return f"s-{uuid.uuid4().hex}"


def open_at_once(url: str, threads: int, barrier: Any, results: Any) -> None:
    """Open (and so migrate) the store from several threads the moment all processes are up."""
    errors: list[str] = []
    start = threading.Barrier(threads)

    def opener() -> None:
        start.wait()
        try:
            open_store(url).close()
        except Exception as exc:  # reported to the parent
            errors.append(repr(exc))

    workers = [threading.Thread(target=opener) for _ in range(threads)]
    barrier.wait()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    results.put(errors)
