"""``flowmem serve --workers 2`` behind pgbouncer in TRANSACTION pooling mode with a
server pool of 2 (one server connection per serve process): no code path holds a
pooled connection, an open transaction or a store lock while it waits for another
connection of the same pool, so 32 concurrent clients are all answered 2xx
(slower, never stuck) and every acknowledged turn is stored exactly once.

The load touches the records the service updates per turn: each session's first
turn (its status idle → completed) and each token's first use (``last_used_at``).
Change notices LISTEN on the server itself (``listen=``), as docs/deploy.md says.
Skips with the reason when PostgreSQL or pgbouncer is missing.
"""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import httpx
import pytest

from flowmem.service._tokens import TokenBackend
from flowmem.stores import open_async_store, open_store
from pgbouncer_support import pgbouncer, pgbouncer_missing
from postgres_support import throwaway_schema, with_options
from server_support import free_port, serving

REASON = pgbouncer_missing()
pytestmark = [pytest.mark.postgres, pytest.mark.server, pytest.mark.processes,
              pytest.mark.skipif(REASON is not None, reason=REASON or "")]

CLIENTS = 32
SESSIONS = 16
TURNS = 6  # per client


async def _tokens(url: str, count: int) -> list[str]:
    store = open_async_store(url)
    try:
        backend = TokenBackend(store)
        return [await backend.create(f"user{i % 4}", admin=True) for i in range(count)]
    finally:
        await store.aclose()


def test_two_workers_behind_a_pool_of_two_answer_every_client_and_store_each_turn_once(
        ) -> None:
    chooser = random.Random(20261202)
    with throwaway_schema("bouncer_serve") as (url, _), pgbouncer(2) as (address, user):
        open_store(url).close()  # migrate directly; serve through the pooler
        query = urlsplit(url).query
        direct = url.split("?")[0]  # LISTEN needs a session: the server itself
        pooled = with_options(f"postgresql://{user}@{address}/flowmem?{query}",
                              prepared="false", listen=direct)
        secrets = asyncio.run(_tokens(url, CLIENTS))
        started: list[subprocess.Popen[bytes]] = []
        with serving(pooled, free_port(), "--workers", "2", "--rate-limit", "0",
                     started=started) as http:
            admin = {"Authorization": f"Bearer {secrets[0]}"}
            sessions = [http.post("/v1/sessions", json={"title": f"s{i}"}, headers=admin)
                        .json()["data"]["id"] for i in range(SESSIONS)]
            plan = [(secrets[c], sessions[chooser.randrange(SESSIONS)]) for c in range(CLIENTS)]

            def drive(client: int) -> list[tuple[int, str, str]]:
                secret, sid = plan[client]
                seen: list[tuple[int, str, str]] = []
                with httpx.Client(base_url=str(http.base_url), timeout=120,
                                  headers={"Authorization": f"Bearer {secret}"}) as own:
                    for turn in range(TURNS):
                        text = f"c{client} t{turn}"
                        answer = own.post(f"/v1/sessions/{sid}/turns", json={
                            "messages": [{"role": "user", "content": text}]})
                        seen.append((answer.status_code, sid, text))
                return seen

            with ThreadPoolExecutor(CLIENTS) as pool:
                results = [r for batch in pool.map(drive, range(CLIENTS)) for r in batch]
            statuses = Counter(code for code, _, _ in results)
            assert set(statuses) == {200}, statuses
            for sid in sessions:
                page = http.get(f"/v1/sessions/{sid}/messages", params={"limit": 500},
                                headers=admin).json()["data"]["messages"]
                stored = Counter(entry["message"]["content"] for entry in page)
                acknowledged = {text for _, s, text in results if s == sid}
                assert set(stored) == acknowledged
                assert all(n == 1 for n in stored.values()), stored
                status = http.get(f"/v1/sessions/{sid}", headers=admin).json()["data"]
                assert status["status"] == ("completed" if acknowledged else "idle")
        assert started[0].returncode in (0, -signal.SIGTERM)
