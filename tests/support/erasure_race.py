"""Erasing a user while 4 processes append to her conversations, then scanning the whole
store for her (tests/erasure and the Redis Cluster tests run it): see
tests/erasure/test_erasure_processes.py for what it shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from erasure_scan import needles_of
from flowmem import ExecutionContext, Memory
from flowmem.scopes import StorageKey
from flowmem.testing.contract_erasure import Attempt, left_behind

__all__ = ["erasure_race"]

WRITERS = 4
CONVERSATIONS = 40
WRITER = """
import json, os, sys, time
from flowmem import ExecutionContext, Memory
from flowmem.errors import ErasureInProgress
url, user, number, conversations, log, stop = sys.argv[1:]
number, conversations = int(number), int(conversations)
memory = Memory.from_url(url)
context = ExecutionContext(user_id=user)
turn = 0
with open(log, "a", buffering=1) as out:
    while not os.path.exists(stop):
        key = (f"n{number}-{turn}" if turn % 3 == 2
               else f"c{(number * 7 + turn) % conversations:02d}")
        marker, began = f"w{number}-{turn}", time.monotonic()
        try:
            memory.append("user", key, {"role": "user", "content": marker}, context=context,
                          idempotency_key=marker)
            acknowledged = True
        except ErasureInProgress:
            acknowledged = False
        out.write(json.dumps([began, time.monotonic(), marker, key, acknowledged]) + "\\n")
        turn += 1
        if not acknowledged:
            break
memory.close()
"""


def _attempts(logs: list[Path]) -> tuple[list[Attempt], dict[str, str]]:
    attempts: list[Attempt] = []
    keys: dict[str, str] = {}
    for log in logs:
        for line in log.read_text().splitlines():
            began, ended, marker, key, acknowledged = json.loads(line)
            attempts.append(Attempt(began, ended, marker, acknowledged))
            keys[marker] = key
    return attempts, keys


def _lines(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def erasure_race(url: str, scan: Callable[[list[str]], list[str]], tmp_path: Path) -> str:
    """Run the race on the store ``url`` names; ``scan`` finds the needles in the whole
    store. Asserts what it shows; returns the figure to record."""
    user = f"alice-{uuid.uuid4().hex[:12]}"
    context = ExecutionContext(user_id=user)
    memory = Memory.from_url(url)
    for n in range(CONVERSATIONS):
        for turn in range(5):
            memory.append("user", f"c{n:02d}", {"role": "user", "content": f"seed-{n}-{turn}"},
                          context=context, idempotency_key=f"seed-{n}-{turn}")
    memory.write("user", "prefs", {"tone": "short"}, context=context)
    assert scan([user]), "the scan finds her before the erasure"  # the scan sees her
    stop = tmp_path / "stop"
    logs = [tmp_path / f"writer-{n}.log" for n in range(WRITERS)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, url, user, str(n),
                                 str(CONVERSATIONS), str(log), str(stop)], env=env)
               for n, log in enumerate(logs)]
    try:
        while not all(_lines(log) for log in logs):  # every writer is appending
            assert all(w.poll() is None for w in writers), "a writer ended before the erasure"
            time.sleep(0.005)
        began = time.monotonic()
        receipt = memory.erase_user(user)
        stop.touch()
        for writer in writers:
            assert writer.wait(120) == 0
    finally:
        stop.touch()
        for writer in writers:
            if writer.poll() is None:
                writer.kill()
    attempts, keys_of = _attempts(logs)
    refused = [a for a in attempts if not a.acknowledged]
    fenced_until = max([began, *(a.began for a in refused)])
    late = {a.marker for a in attempts if a.acknowledged and a.ended >= fenced_until}
    late_keys = {keys_of[m] for m in late}
    remaining = set(memory.keys("user", context=context, limit=1000))
    found: set[str] = set()
    for key in remaining:
        found |= {str(m["content"]) for m in memory.history("user", key, context=context).messages}
    memory.close()
    every_key = {f"c{n:02d}" for n in range(CONVERSATIONS)} | set(keys_of.values()) | {"prefs"}
    kept = every_key - late_keys  # later appends opened the others again: they name her
    needles = needles_of(user, [StorageKey("user", user, k) for k in sorted(kept)])[1:]
    shown = (f"\nerasure under {WRITERS} appending processes ({url.split(':')[0]}): "
           f"{len(attempts)} appends, {len(refused)} refused, {len(late)} acknowledged after "
           f"the fence was last seen; receipt {receipt.counts}")
    assert receipt.conversations >= CONVERSATIONS and receipt.values == 1
    behind = left_behind(attempts, found, began)
    assert behind == [], behind
    assert remaining <= late_keys, remaining - late_keys  # only what later appends opened
    if not late:
        needles = needles_of(user, [StorageKey("user", user, k) for k in sorted(every_key)])
    findings = scan(needles)
    assert findings == [], findings
    return shown
