"""PostgreSQL appends (#14): round trips per append and µs per append, both faces.

    python bench/postgres_appends.py [--url postgresql://127.0.0.1:5432/test]
        [--appends 400] [--rounds 5] [--json]

1. **Round trips**, counted by a TCP proxy between the store and the server
   (``tests/round_trip_proxy.py``: a round trip is each time the client sends
   after having received), for: the first append of a new conversation, the
   common append (one message, then three, to an existing conversation, no
   window), a healing append (MEM-3), a placeholder replaced (MEM-10) and a
   windowed append that evicts.
2. **µs per append**: ``--rounds`` windows of ``--appends`` one-message
   appends (user / assistant call / tool result / assistant text, repeating)
   to an existing conversation, straight to the server (or through the proxy
   adding ``--latency-ms`` to each round trip: a network); wall, client CPU
   (``time.process_time``) and the server process's CPU (``/proc/PID/schedstat``
   of the pooled connection's backend, when readable) per append, the median
   over the windows.

Only the Store protocol is used, so the same script measures another tree:
``PYTHONPATH=/path/to/other/src python bench/postgres_appends.py`` (A/B:
alternate the two trees and compare medians). Each run writes in a schema
of its own, dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import psycopg  # noqa: E402

from flowmem.scopes import StorageKey  # noqa: E402
from flowmem.stores.postgres import PostgresStore  # noqa: E402
from flowmem.stores.postgres_async import AsyncPostgresStore  # noqa: E402
from round_trip_proxy import CountingProxy, through  # noqa: E402

Message = dict[str, Any]
LOCK = 5.0


def _user(text: str) -> Message:
    return {"role": "user", "content": text}


def _call(call_id: str) -> Message:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}]}


def _result(call_id: str) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": "42"}


def _cycle(i: int) -> Message:
    """The i-th message of a repeating turn: user, call, result, answer."""
    call = f"call_{i // 4}"
    return [_user(f"q{i}"), _call(call), _result(call),
            {"role": "assistant", "content": f"a{i}"}][i % 4]


def _scenarios() -> list[tuple[str, list[tuple[list[Message], int | None]], int | None]]:
    """(name, untimed appends before, (messages, max_messages) of the counted append)."""
    return [
        ("first append (new conversation)", [], None),
        ("common: 1 message", [([_user("hi")], None)], None),
        ("common: 3 messages", [([_user("hi")], None)], None),
        ("healing append (MEM-3)", [([_user("hi"), _call("x")], None)], None),
        ("placeholder replaced (MEM-10)", [([_user("hi"), _call("x"), _user("on")], None)], None),
        ("windowed, evicting", [([_user(f"m{i}") for i in range(4)], None)], 4),
    ]


_COUNTED: dict[str, list[Message]] = {
    "first append (new conversation)": [_user("hi")],
    "common: 1 message": [_user("next")],
    "common: 3 messages": [_call("c3"), _result("c3"), {"role": "assistant", "content": "ok"}],
    "healing append (MEM-3)": [_user("moving on")],
    "placeholder replaced (MEM-10)": [_result("x")],
    "windowed, evicting": [_user("m4")],
}


def _key(tag: str) -> StorageKey:
    return StorageKey("workflow", "bench", f"{tag}-{uuid.uuid4().hex[:8]}")


def round_trips(url: str) -> dict[str, dict[str, int]]:
    """Round trips of each scenario, per face."""
    parts = urlsplit(url)
    counts: dict[str, dict[str, int]] = {}
    with CountingProxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
        proxied = through(proxy, url)
        store = PostgresStore.from_url(f"{proxied}&pool_min=1&pool_max=1")
        try:
            store.append(_key("warm"), [_user("x")], max_messages=None, lock_timeout=LOCK)
            for name, before, window in _scenarios():
                key = _key("rt")
                for messages, limit in before:
                    store.append(key, messages, max_messages=limit, lock_timeout=LOCK)
                start = proxy.count()
                store.append(key, _COUNTED[name], max_messages=window, lock_timeout=LOCK)
                counts.setdefault(name, {})["blocking"] = proxy.count() - start
        finally:
            store.close()

        async def run_async() -> None:
            astore = AsyncPostgresStore.from_url(f"{proxied}&pool_min=1&pool_max=1")
            try:
                await astore.append(_key("warm"), [_user("x")], max_messages=None,
                                    lock_timeout=LOCK)
                for name, before, window in _scenarios():
                    key = _key("rt")
                    for messages, limit in before:
                        await astore.append(key, messages, max_messages=limit, lock_timeout=LOCK)
                    start = proxy.count()
                    await astore.append(key, _COUNTED[name], max_messages=window,
                                        lock_timeout=LOCK)
                    counts[name]["asyncio"] = proxy.count() - start
            finally:
                await astore.aclose()

        asyncio.run(run_async())
    return counts


def _backend(url: str, app: str) -> int | None:
    """The server process of the store's one pooled connection (``application_name``)."""
    try:
        with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
            row = conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                               (app,)).fetchone()
        return int(row[0]) if row else None
    except psycopg.Error:
        return None


def _server_ns(pid: int | None) -> int:
    """CPU time the server process ran so far, in ns (0 when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/schedstat") as stat:
            return int(stat.read().split()[0])
    except (OSError, ValueError):
        return 0


def _window(append: Callable[[Sequence[Message]], Any], appends: int, offset: int,
            pid: int | None = None) -> tuple[float, float, float]:
    wall, cpu, server = time.perf_counter(), time.process_time(), _server_ns(pid)
    for i in range(appends):
        append([_cycle(offset + i)])
    return ((time.perf_counter() - wall) / appends * 1e6,
            (time.process_time() - cpu) / appends * 1e6,
            (_server_ns(pid) - server) / appends / 1e3)


def _medians(runs: list[tuple[float, float, float]]) -> dict[str, float]:
    return {name: statistics.median(r[i] for r in runs)
            for i, name in enumerate(("wall_us", "cpu_us", "server_cpu_us"))}


def timings(url: str, appends: int, rounds: int,
            latency: float = 0.0) -> dict[str, dict[str, float]]:
    """Median µs per one-message append (wall, CPU), per face; with ``latency`` seconds
    added to every round trip by a proxy."""
    if latency:
        parts = urlsplit(url)
        with CountingProxy(parts.hostname or "127.0.0.1", parts.port or 5432,
                           delay=latency) as proxy:
            return timings(through(proxy, url), appends, rounds)
    out: dict[str, dict[str, float]] = {}
    app = f"flowmem-bench-{uuid.uuid4().hex[:8]}"
    store = PostgresStore.from_url(f"{url}&pool_min=1&pool_max=1&application_name={app}")
    try:
        key = _key("t")
        store.append(key, [_user("start")], max_messages=None, lock_timeout=LOCK)
        pid = _backend(url, app)

        def append(messages: Sequence[Message]) -> Any:
            return store.append(key, messages, max_messages=None, lock_timeout=LOCK)

        _window(append, 40, 0)  # warm up
        out["blocking"] = _medians([_window(append, appends, 40 + r * appends, pid)
                                    for r in range(rounds)])
    finally:
        store.close()

    async def run_async() -> list[tuple[float, float, float]]:
        astore = AsyncPostgresStore.from_url(
            f"{url}&pool_min=1&pool_max=1&application_name={app}-a")
        key = _key("t")
        try:
            await astore.append(key, [_user("start")], max_messages=None, lock_timeout=LOCK)
            pid = _backend(url, f"{app}-a")
            results = []
            for r in range(rounds + 1):
                n = appends if r else 40
                wall, cpu, server = time.perf_counter(), time.process_time(), _server_ns(pid)
                for i in range(n):
                    await astore.append(key, [_cycle(r * appends + i)], max_messages=None,
                                        lock_timeout=LOCK)
                results.append(((time.perf_counter() - wall) / n * 1e6,
                                (time.process_time() - cpu) / n * 1e6,
                                (_server_ns(pid) - server) / n / 1e3))
            return results[1:]
        finally:
            await astore.aclose()

    out["asyncio"] = _medians(asyncio.run(run_async()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument("--appends", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--latency-ms", type=float, default=0.0,
                        help="time through a proxy adding this much to every round trip")
    parser.add_argument("--skip-round-trips", action="store_true")
    parser.add_argument("--json", action="store_true", help="one JSON line")
    args = parser.parse_args()
    schema = f"bench_pg_{uuid.uuid4().hex[:8]}"
    url = f"{args.url}{'&' if '?' in args.url else '?'}schema={schema}"
    try:
        result: dict[str, Any] = {"timings": timings(url, args.appends, args.rounds,
                                                     args.latency_ms / 1000)}
        if not args.skip_round_trips:
            result["round_trips"] = round_trips(url)
    finally:
        with psycopg.connect(args.url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    if args.json:
        print(json.dumps(result))
        return
    for face, figures in result["timings"].items():
        print(f"{face:9s} {figures['wall_us']:8.0f} µs wall  {figures['cpu_us']:8.0f} µs client "
              f"CPU  {figures['server_cpu_us']:6.0f} µs server CPU per one-message append")
    for name, faces in result.get("round_trips", {}).items():
        print(f"{name:34s} " + "  ".join(f"{f} {n}" for f, n in faces.items()))


if __name__ == "__main__":
    main()
