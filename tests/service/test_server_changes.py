"""What a serving process keeps between requests, and when it forgets it (server/changes.py),
the minimal return (``Prefer: return=minimal``) and the append fast path (server/fastpath.py).

The rules these tests hold (MEM-8, MEM-9, docs/http.md): a revoked token answers 401 and a
stopped session refuses its next turn AT ONCE — whether the change went through this
process or another one on the same store (``flowmem token revoke``, ``flowmem sessions
stop``) — and a viewer whose view was revoked no longer sees the session. No time is
asserted anywhere; store calls are counted on the real store.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from flowmem.async_memory import AsyncMemory
from flowmem.cli._main import main
from flowmem.server import Settings
from flowmem.service._changes import Changes, LocalCache
from flowmem.service._sessions import SessionRegistry
from flowmem.service._tokens import TokenBackend
from server_support import USERS, World, make_world

TURN = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'changes.db'}"


@pytest.fixture
def world(url: str) -> Iterator[World]:
    opened = make_world(url)
    yield opened
    opened.close()


def _turn(world: World, role: str = "owner", sid: str | None = None, **headers: str) -> Any:
    sent = {**world.headers(role), "Content-Type": "application/json", **headers}
    return world.client.post(f"/v1/sessions/{sid or world.session_id}/turns", json=TURN,
                             headers=sent)


def _elsewhere(world: World, url: str, work: Any) -> Any:
    """``await work(memory)`` on another store instance of the same file: another process's
    view (its own connection, its own registry, no shared memory with the app)."""
    async def run() -> Any:
        async with AsyncMemory.from_url(url) as memory:
            return await work(memory)

    return world.run(run)


def test_a_token_revoked_in_this_process_is_refused_at_once(world: World) -> None:
    assert _turn(world).status_code == 200  # the token is now kept in memory
    backend: TokenBackend = world.app.state.flowmem.tokens
    assert world.run(backend.revoke, backend.token_id(world.tokens["owner"]))
    refused = _turn(world)
    assert refused.status_code == 401 and refused.json()["error_code"] == "invalid_token"


def test_a_token_revoked_by_another_process_is_refused_at_once(world: World, url: str) -> None:
    assert world.call("owner", "GET", "/v1/whoami").status_code == 200
    token_id = TokenBackend.token_id(world.tokens["owner"])
    done = CliRunner().invoke(main, ["token", "revoke", token_id, "--store", url])
    assert done.exit_code == 0, done.output
    assert world.call("owner", "GET", "/v1/whoami").status_code == 401
    assert _turn(world).status_code == 401


def test_a_session_stopped_here_refuses_its_next_turn_at_once(world: World) -> None:
    assert _turn(world).status_code == 200
    assert world.call("owner", "POST", f"/v1/sessions/{world.session_id}/stop").status_code == 200
    refused = _turn(world)
    assert refused.status_code == 409 and refused.json()["error_code"] == "session_stopped"
    assert world.call("owner", "POST", f"/v1/sessions/{world.session_id}/reset").status_code \
        == 200
    assert _turn(world).status_code == 200


def test_a_session_stopped_by_another_process_refuses_its_next_turn_at_once(
        world: World, url: str) -> None:
    assert _turn(world).status_code == 200
    stopped = _elsewhere(world, url, lambda m: SessionRegistry(m.store).set_status(
        world.session_id, "stopped"))
    assert stopped is not None and stopped.status == "stopped"
    refused = _turn(world)
    assert refused.status_code == 409 and refused.json()["error_code"] == "session_stopped"


def test_a_view_revoked_by_another_process_is_gone_at_once(world: World, url: str) -> None:
    path = f"/v1/sessions/{world.session_id}"
    assert world.call("viewer", "GET", path).status_code == 200  # MEM-9: viewers read
    _elsewhere(world, url, lambda m: SessionRegistry(m.store).revoke(world.session_id,
                                                                     USERS["viewer"]))
    assert world.call("viewer", "GET", path).status_code == 404
    _elsewhere(world, url, lambda m: SessionRegistry(m.store).grant(world.session_id,
                                                                    USERS["viewer"]))
    assert world.call("viewer", "GET", path).status_code == 200


def test_a_fill_that_raced_a_change_is_not_kept() -> None:
    cache: LocalCache[str, str] = LocalCache()
    began = cache.epoch
    cache.replace("s", None)  # the change lands while the fill's read was in flight
    cache.put("s", "old", began)
    assert cache.get("s") is None
    cache.put("s", "new", cache.epoch)
    assert cache.get("s") == "new"
    cache.clear()
    assert cache.get("s") is None


def test_an_entry_is_kept_no_longer_than_its_age() -> None:
    cache: LocalCache[str, str] = LocalCache(max_age=0.0)
    cache.put("s", "v", cache.epoch)
    assert cache.get("s") is None


class Counting:
    """A real store, its calls counted by method."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.calls: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.store, name)
        if name in {"read", "write", "delete", "append", "history", "keys", "edit", "lock"}:
            def counted(*args: Any, **kwargs: Any) -> Any:
                self.calls[name] += 1
                return found(*args, **kwargs)
            return counted
        return found


def test_concurrent_requests_share_one_read_of_the_changes(url: str) -> None:
    async def run() -> int:
        async with AsyncMemory.from_url(url) as memory:
            counting = Counting(memory.store)
            changes = Changes(counting)  # type: ignore[arg-type]
            await asyncio.gather(*(changes.settle() for _ in range(50)))
            return counting.calls["read"]

    assert 1 <= asyncio.run(run()) <= 2


def _count_turns(world: World, **headers: str) -> collections.Counter[str]:
    store = world.memory.store
    counting = Counting(store)
    world.memory.store = counting  # type: ignore[assignment]
    server = world.app.state.flowmem
    for part in (server.tokens, server.sessions, server.changes):
        part.store = counting
    try:
        assert _turn(world, **headers).status_code == 200
        return counting.calls
    finally:
        world.memory.store = store
        for part in (server.tokens, server.sessions, server.changes):
            part.store = store


def test_a_steady_turn_costs_one_small_read_besides_the_append(world: World) -> None:
    """Before: the token's record, the session's record, the append, the echo (4 calls);
    now the token and the session come from memory after one read of the changes record,
    and the echo is the append's own tail (``tail=``): no history call."""
    _turn(world)
    assert _count_turns(world) == {"read": 1, "append": 1}
    assert _count_turns(world, Prefer="return=minimal") == {"read": 1, "append": 1}


def test_return_minimal_answers_the_report_without_the_echo(world: World) -> None:
    full = _turn(world)
    minimal = _turn(world, Prefer="respond-async, return=minimal")
    assert minimal.headers["preference-applied"] == "return=minimal"
    assert "preference-applied" not in full.headers
    assert full.json()["data"]["messages"] and full.json()["data"]["before"] is None
    data = minimal.json()["data"]
    assert set(data) == set(full.json()["data"])
    assert data["messages"] == [] and data["before"] is None
    assert data["count"] == full.json()["data"]["count"] + 1 and data["appended"] == 1
    ignored = _turn(world, Prefer="return=representation")
    assert ignored.json()["data"]["messages"] and "preference-applied" not in ignored.headers
    body = {"scope": "user", "key": "notes", **TURN}
    appended = world.client.post("/v1/memory/append", json=body, headers={
        **world.headers("owner"), "Prefer": "return=minimal"})
    assert appended.status_code == 200 and appended.json()["data"]["messages"] == []
    assert appended.headers["preference-applied"] == "return=minimal"


# The fast path answers exactly as the FastAPI route does -------------------------------------
CASES: list[tuple[str, str, Any, dict[str, str], str]] = [
    # (role, session, body, headers, query)
    ("owner", "mine", TURN, {}, ""),
    ("owner", "mine", TURN, {"Prefer": "return=minimal"}, ""),
    ("owner", "mine", TURN, {"Idempotency-Key": "k1"}, ""),
    ("owner", "mine", TURN, {"Idempotency-Key": "k1"}, ""),  # replayed
    ("owner", "mine", {"messages": [{"role": "user", "content": "x"}]},
     {"Idempotency-Key": "k1"}, ""),  # reused with another body: 422
    ("owner", "mine", TURN, {"Idempotency-Key": "bad key"}, ""),
    ("owner", "mine", {"messages": []}, {}, ""),
    ("owner", "mine", {"messages": [{"role": "nobody", "content": 1}]}, {}, ""),
    ("owner", "mine", {**TURN, "extra": 1}, {}, ""),
    ("owner", "mine", [TURN], {}, ""),
    ("owner", "mine", {}, {}, ""),
    ("owner", "mine", {**TURN, "max_messages": 2}, {}, ""),  # MEM-15: admins only
    ("admin", "mine", {**TURN, "max_messages": 2}, {}, ""),
    ("owner", "mine", TURN, {}, "x=1"),
    ("viewer", "mine", TURN, {}, ""),  # MEM-9: viewers never drive
    ("other", "mine", TURN, {}, ""),
    ("owner", "0" * 32, TURN, {}, ""),
    ("owner", "not-an-id", TURN, {}, ""),
    ("anonymous", "mine", TURN, {}, ""),
    ("owner", "mine", TURN, {"Authorization": "Bearer fm_nope"}, ""),
    ("owner", "mine", TURN, {"Authorization": "Basic abc"}, ""),
    ("owner", "mine", {"messages": [{"role": "user", "content": "x" * 300_000}]}, {}, ""),
    ("owner", "stopped", TURN, {}, ""),
]


def _answers(fast: bool) -> list[tuple[Any, ...]]:
    world = make_world(settings=Settings(rate_limit=0.0, fast_turns=fast))
    stopped = world.new_session("owner")
    world.call("owner", "POST", f"/v1/sessions/{stopped}/stop")
    seen = []
    for role, where, body, headers, query in CASES:
        sid = {"mine": world.session_id, "stopped": stopped}.get(where, where)
        sent = {**world.headers(role), "Content-Type": "application/json", **headers}
        response = world.client.post(f"/v1/sessions/{sid}/turns" + (f"?{query}" if query
                                                                       else ""),
                                     json=body, headers=sent)
        payload = response.json()
        data = payload.get("data")
        seen.append((response.status_code, payload.get("error_code"),
                     payload.get("details"),
                     sorted(data) if isinstance(data, dict) else data,
                     [m["message"] for m in data["messages"]] if isinstance(data, dict)
                     else None,
                     {k: v for k, v in response.headers.items()
                      if k in {"idempotent-replayed", "preference-applied", "www-authenticate",
                               "content-type", "content-length"}}))
    world.close()
    return seen


def test_the_fast_path_answers_as_the_route_does() -> None:
    fast, routed = _answers(True), _answers(False)
    for case, (mine, theirs) in enumerate(zip(fast, routed, strict=True)):
        assert mine == theirs, (CASES[case], mine, theirs)


def test_flowmem_serve_parses_with_httptools_keeping_the_head_deadline() -> None:
    """``flowmem serve`` serves with uvicorn's httptools protocol when it is installed (the
    server extra), with the same slow-head deadline as the h11 one (docs/security.md)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    from flowmem.server._protocols import DeadlineProtocol, _Deadlines, protocol

    chosen = protocol()
    assert issubclass(chosen, _Deadlines) and issubclass(DeadlineProtocol, H11Protocol)
    httptools = pytest.importorskip("uvicorn.protocols.http.httptools_impl")
    assert issubclass(chosen, httptools.HttpToolsProtocol)
