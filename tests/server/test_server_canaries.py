"""Cross-user canaries: 20 users x 5 sessions appending concurrently through one live app.

Every user writes marked content ("CANARY-<user>-...") into its sessions, its
``user`` scope and its sessions' ``session`` scope, all users using the SAME
session title and the SAME memory keys. Then every response any user ever
received is scanned: a canary of another user in it is a leak. Expected: 0.
"""

from __future__ import annotations

import asyncio
import random
import re
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from figures import Figure
from flowmem.async_memory import AsyncMemory
from flowmem.server import create_app
from server_support import check_envelope, live_server

USERS = [f"u{i:02d}" for i in range(20)]
SESSIONS_PER_USER = 5
TURNS = 2
CANARY = re.compile(r"CANARY-(u\d\d)-")


class Audit:
    """Every response body, per requesting user."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.own = 0
        self.foreign: list[tuple[str, str]] = []

    def check(self, user: str, response: httpx.Response) -> Any:
        assert response.status_code < 300, response.text
        found = CANARY.findall(response.text)
        with self.lock:
            self.own += sum(1 for owner in found if owner == user)
            self.foreign += [(user, owner) for owner in found if owner != user]
        return response.json()["data"]


def test_no_foreign_canary_in_any_response(tmp_path: Path, figure: Figure) -> None:
    # SQLite's async store is not bound to a loop: tokens are made on a loop of their
    # own, the server's thread runs another, and the memory is closed on a third.
    memory = AsyncMemory.from_url(f"sqlite:///{tmp_path}/canaries.db?synchronous=normal")
    app = create_app(memory)

    async def issue() -> dict[str, str]:
        return {u: await app.state.flowmem.tokens.create(u) for u in USERS}

    tokens = asyncio.run(issue())
    audit = Audit()
    with live_server(app) as base, httpx.Client(
            base_url=base, timeout=30, limits=httpx.Limits(max_connections=32),
            event_hooks={"response": [check_envelope]}) as http:

        def call(user: str, method: str, path: str, body: Any = None,
                 params: dict[str, Any] | None = None) -> Any:
            headers = {"Authorization": f"Bearer {tokens[user]}"}
            return audit.check(user, http.request(method, path, json=body, headers=headers,
                                                  params=params))

        def create(user: str) -> list[str]:
            return [call(user, "POST", "/v1/sessions", {"title": "same title"})["id"]
                    for _ in range(SESSIONS_PER_USER)]

        with ThreadPoolExecutor(32) as pool:
            sessions = dict(zip(USERS, pool.map(create, USERS), strict=True))

        def drive(task: tuple[str, str, int]) -> None:
            user, sid, n = task
            mark = f"CANARY-{user}-{sid[:6]}-{n}"
            call(user, "POST", f"/v1/sessions/{sid}/turns",
                 {"messages": [{"role": "user", "content": mark},
                               {"role": "assistant", "content": f"ack {mark}"}]})
            call(user, "POST", "/v1/memory/append",
                 {"scope": "user", "key": "log", "messages": [{"role": "user", "content": mark}]})
            call(user, "POST", "/v1/memory/write",
                 {"scope": "session", "key": "notes", "value": mark, "session_id": sid})
            call(user, "POST", "/v1/memory/write",
                 {"scope": "user", "key": "profile", "value": f"CANARY-{user}-profile"})

        tasks = [(u, sid, n) for u in USERS for sid in sessions[u] for n in range(TURNS)]
        random.Random(7).shuffle(tasks)
        with ThreadPoolExecutor(32) as pool:
            list(pool.map(drive, tasks))

        def read_back(user: str) -> Counter[str]:
            counts: Counter[str] = Counter()
            listed = call(user, "GET", "/v1/sessions", params={"limit": 100})
            assert sorted(s["id"] for s in listed) == sorted(sessions[user])
            for sid in sessions[user]:
                page = call(user, "GET", f"/v1/sessions/{sid}/messages")
                counts["messages"] += len(page["messages"])
                call(user, "POST", "/v1/memory/read",
                     {"scope": "session", "key": "notes", "session_id": sid})
            log = call(user, "POST", "/v1/memory/read", {"scope": "user", "key": "log"})
            counts["log"] += len(log["value"])
            call(user, "POST", "/v1/memory/read", {"scope": "user", "key": "profile"})
            return counts

        with ThreadPoolExecutor(32) as pool:
            totals = sum(pool.map(read_back, USERS), Counter())
    asyncio.run(memory.aclose())
    figure(f"\ncanaries: {len(USERS)} users x {SESSIONS_PER_USER} sessions, {len(tasks)} "
          f"concurrent drives; own canaries seen {audit.own}; foreign canaries "
          f"{len(audit.foreign)}")
    assert audit.foreign == []
    assert totals["messages"] == len(USERS) * SESSIONS_PER_USER * TURNS * 2
    assert totals["log"] == len(USERS) * SESSIONS_PER_USER * TURNS
