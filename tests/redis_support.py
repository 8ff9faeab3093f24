"""Helpers for the Redis tests: URLs, key clean-up, a cuttable TCP proxy, contention writers.

This module has no test in it: spawned writer processes import it by name.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from backends import REDIS_URL
from flowmem import ExecutionContext, Memory

SCOPE = "session"
KEY = "contention"
CONTEXT = ExecutionContext(session_id="redis-mem12", node_id="n", pipeline_id="p",
                           workflow_id="w")


def session_prefix() -> str:
    """A key prefix no other test session uses."""
    return f"fmtest-{uuid.uuid4().hex[:12]}"


def url_with(prefix: str, base: str = REDIS_URL, **options: Any) -> str:
    query = "&".join([f"prefix={prefix}", *(f"{k}={v}" for k, v in options.items())])
    return f"{base}{'&' if '?' in base else '?'}{query}"


def raw_client(base: str = REDIS_URL) -> Any:
    import redis

    return redis.Redis.from_url(base)


def drop_prefix(prefix: str, base: str = REDIS_URL) -> int:
    """Delete every key a store with ``prefix`` may have written; how many."""
    client = raw_client(base)
    removed = 0
    try:
        for pattern in ("{" + prefix + ":*", prefix + ":idx:*"):
            batch = list(client.scan_iter(match=pattern, count=1000))
            for start in range(0, len(batch), 500):
                removed += client.delete(*batch[start:start + 500])
    finally:
        client.close()
    return removed


class CuttableProxy:
    """A TCP proxy in front of Redis that a test can cut (every connection, and the port)."""

    def __init__(self, base: str = REDIS_URL) -> None:
        parts = urlsplit(base)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 6379)
        self.db = parts.path or "/0"
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.cut_done = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}{self.db}"

    def _accept(self) -> None:
        while not self.cut_done.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            if self.cut_done.is_set():
                client.close()
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Drop every proxied connection and stop listening (reconnects are refused)."""
        self.cut_done.set()
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self.server.close()
        for s in self.sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


# -- contention writers (MEM-12, MEM-1) -------------------------------------------------
def batch(writer: str, i: int) -> list[dict[str, Any]]:
    """Append ``i`` of ``writer``: a turn declaring a unique id, its result, and a re-fire
    of an earlier id's result (MEM-1 must drop it); every 10th append opens with a user
    turn (MEM-3 then finds nothing to heal: each call is answered in its own append)."""
    call = f"{writer}-{i}"
    out: list[dict[str, Any]] = []
    if i % 10 == 0:
        out.append({"role": "user", "content": f"u:{writer}-{i}"})
    out += [{"role": "assistant", "content": None,
             "tool_calls": [{"id": call, "type": "function",
                             "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": call, "content": f"result of {call}"}]
    if i > 0:
        earlier = f"{writer}-{i // 2}"
        out.append({"role": "tool", "tool_call_id": earlier, "content": f"re-fired {earlier}"})
    return out


def expected_entries(writer: str, appends: int) -> list[str]:
    """The identities ``writer`` must leave in the buffer, in order."""
    out: list[str] = []
    for i in range(appends):
        if i % 10 == 0:
            out.append(f"u:{writer}-{i}")
        out += [f"a:{writer}-{i}", f"t:{writer}-{i}"]
    return out


def identity(message: dict[str, Any]) -> str:
    metadata = message.get("metadata") or {}
    if message["role"] == "assistant":
        return "a:" + ",".join(c["id"] for c in metadata["tool_calls"])
    if message["role"] == "tool":
        return ("h:" if metadata.get("healed") else "t:") + metadata["tool_call_id"]
    return str(message["content"])


@dataclass
class Stats:
    appends: int = 0
    appended: int = 0
    fallbacks: int = 0
    errors: list[str] = field(default_factory=list)


def write(memory: Memory, writer: str, appends: int) -> Stats:
    stats = Stats()
    for i in range(appends):
        try:
            result = memory.append(SCOPE, KEY, batch(writer, i), context=CONTEXT)
        except Exception as exc:  # reported, not raised: a lost turn fails the audit
            stats.errors.append(f"{writer}-{i}: {type(exc).__name__}: {exc}")
            continue
        stats.appends += 1
        stats.appended += result.appended
        stats.fallbacks += not result.serialized
    return stats


def process_writer(url: str, name: str, threads: int, appends: int, barrier: Any,
                   queue: Any) -> None:
    """A spawned process: its own store, ``threads`` writers, stats to ``queue``."""
    memory = Memory.from_url(url)
    results: list[Stats] = []
    try:
        barrier.wait()

        def body(writer: str) -> None:
            results.append(write(memory, writer, appends))

        workers = [threading.Thread(target=body, args=(f"{name}t{t}",)) for t in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        memory.close()
    total = Stats(sum(s.appends for s in results), sum(s.appended for s in results),
                  sum(s.fallbacks for s in results), [e for s in results for e in s.errors])
    queue.put(total)


@dataclass
class Audit:
    expected: int
    stored: int
    lost: int
    duplicates: int
    order_violations: int
    split_pairs: int

    def line(self) -> str:
        return (f"expected {self.expected}, stored {self.stored}, lost {self.lost}, "
                f"duplicates {self.duplicates}, order violations {self.order_violations}, "
                f"split turn/result pairs {self.split_pairs}")


def audit(messages: list[dict[str, Any]], writers: list[str], appends: int) -> Audit:
    ids = [identity(m) for m in messages]
    counts = Counter(ids)
    where = {name: i for i, name in enumerate(ids)}
    expected = lost = order = split = 0
    for writer in writers:
        mine = expected_entries(writer, appends)
        expected += len(mine)
        lost += sum(1 for name in mine if name not in counts)
        present = [where[name] for name in mine if name in where]
        order += sum(1 for a, b in itertools.pairwise(present) if a > b)
        split += sum(1 for name in mine if name.startswith("a:")
                     and where.get("t:" + name[2:], -1) != where.get(name, -2) + 1)
    return Audit(expected, len(messages), lost, sum(c - 1 for c in counts.values() if c > 1),
                 order, split)


def wait_until(predicate: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())
