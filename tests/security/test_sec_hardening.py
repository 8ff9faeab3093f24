"""The hardening findings of the second review, each attacked through the ASGI app.

Each test failed on the code before its fix. The same cases run against a
real ``flowmem serve`` process in ``test_sec_attacks.py``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from attack_support import AttackClient, attack_world, case, expect, no_deviations
from figures import Figure
from flowmem.async_memory import AsyncMemory
from flowmem.server import Settings, create_app
from flowmem.server._gate import _depth_pattern, json_depth_error

DEPTH = 63


def deep_body(size: int, depth: int = DEPTH) -> bytes:
    """``size`` bytes (about) of arrays nested ``depth`` deep, again and again."""
    one = b"[" * (depth - 1) + b"]" * (depth - 1)
    return b"[" + b",".join([one] * max(1, size // (len(one) + 1))) + b"]"


def flat_body(size: int) -> bytes:
    """As many bytes of empty arrays side by side: as many brackets, depth 2."""
    return b"[" + b",".join([b"[]"] * max(1, size // 3)) + b"]"


def _best_of(runs: int, work: Any) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return best


def test_the_depth_check_costs_the_same_however_deep_the_body_nests(figure: Figure) -> None:
    """One linear pass: the depth pattern's text grows linearly with the depth and every
    quantifier in it is possessive, so the regex engine never backtracks (each byte of
    the skeleton is looked at once), whatever the nesting. The old check removed
    innermost pairs 63 times over: size x depth work. The time of a body nested at the
    allowed 63 levels against a flat body of the same size is recorded as a figure
    (a ratio from one run; never asserted: the machine may be loaded)."""
    size = 1 << 20
    deep, flat = deep_body(size), flat_body(size)
    assert json_depth_error(deep, DEPTH) is None
    assert json_depth_error(b"[" + deep + b"]", DEPTH) is not None
    assert json_depth_error(flat, DEPTH) is None
    one, two = _depth_pattern(DEPTH).pattern, _depth_pattern(2 * DEPTH).pattern
    assert len(two) == 2 * len(one)  # linear in the depth
    assert one.count(b"*") == one.count(b"*+") == DEPTH  # possessive: no backtracking
    assert b"+?" not in one and b"{" not in one  # no lazy or counted repeats either
    deep_time = _best_of(3, lambda: json_depth_error(deep, DEPTH))
    flat_time = _best_of(3, lambda: json_depth_error(flat, DEPTH))
    figure(f"\ndepth check of a 1 MiB body: nested {DEPTH} deep {deep_time * 1e3:.1f} ms, "
           f"flat {flat_time * 1e3:.1f} ms (ratio {deep_time / max(flat_time, 1e-6):.1f})")


def test_no_byte_of_a_body_is_read_before_the_token_is_valid() -> None:
    """Without a token, or with a wrong one, the answer is 401 and ``receive`` was never
    called: not one byte of the body was read, let alone checked or parsed."""
    world = attack_world(seed=False)
    app = world.app
    for headers, code in (([], "unauthenticated"),
                          ([(b"authorization", b"Bearer fm_wrong")], "invalid_token")):
        read: list[int] = []
        sent: list[dict[str, Any]] = []

        async def receive(into: list[int] = read) -> dict[str, Any]:
            into.append(1)
            return {"type": "http.request", "body": deep_body(1 << 16), "more_body": False}

        async def send(message: dict[str, Any], into: list[dict[str, Any]] = sent) -> None:
            into.append(message)

        scope = {"type": "http", "method": "POST", "path": "/v1/memory/write", "raw_path":
                 b"/v1/memory/write", "query_string": b"", "root_path": "", "scheme": "http",
                 "http_version": "1.1", "client": ("127.0.0.1", 5000),
                 "server": ("127.0.0.1", 80),
                 "headers": [(b"host", b"localhost"), (b"content-type", b"application/json"),
                             (b"content-length", b"65536"), *headers]}
        world.client.portal.call(app, scope, receive, send)
        status = next(m["status"] for m in sent if m["type"] == "http.response.start")
        body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        case(f"gate 401 before reading ({code})", status == 401 and code.encode() in body,
             f"{status} {body[:120]!r}")
        case(f"gate never read the body ({code})", not read, f"receive called {len(read)}x")
    no_deviations("gate ")


def test_a_valid_token_still_gets_its_body_gated() -> None:
    world = attack_world(seed=False)
    headers = {**world.headers("owner"), "Content-Type": "application/json"}
    too_deep = b'{"scope":"user","key":"k","value":' + b"[" * 64 + b"]" * 64 + b"}"
    expect("gated too deep", world.client.post("/v1/memory/write", content=too_deep,
                                                headers=headers), 400, "body_too_deep")
    ok = b'{"scope":"user","key":"k","value":' + b"[" * 62 + b"]" * 62 + b"}"
    expect("gated 63 deep", world.client.post("/v1/memory/write", content=ok, headers=headers),
           200)
    big = b'{"scope":"user","key":"k","value":' + flat_body(200_000) + b"}"  # parsed off-loop
    expect("gated large body", world.client.post("/v1/memory/write", content=big,
                                                 headers=headers), 200)
    no_deviations("gated ")


def test_the_rate_limit_counts_the_token_however_the_header_is_spelled() -> None:
    world = attack_world(Settings(rate_limit=0.001, burst=3), seed=False)
    token = world.tokens["owner"]
    spellings = [f"Bearer {token}", f"bearer {token}", f"BEARER {token}", f"Bearer  {token}",
                 f"  Bearer {token}  ", f"bEaReR\t{token}".replace("\t", " ")]
    answers = [world.client.get("/v1/whoami", headers={"Authorization": spelling})
               for spelling in spellings]
    statuses = [a.status_code for a in answers]
    case("limit one bucket for every spelling", statuses[:3] == [200] * 3
         and all(s == 429 for s in statuses[3:]), str(statuses))
    no_deviations("limit ")


def test_a_read_only_store_never_fails_a_request_for_bookkeeping(tmp_path: Path) -> None:
    """``last_used_at`` is best-effort: on a read-only store a token's first request of the
    minute answers 200 like any other, and nothing is written."""
    url = f"sqlite:///{tmp_path / 'ro.db'}"
    world = attack_world(store=url, seed=False)
    token = world.tokens["owner"]
    world.close()
    memory = AsyncMemory.from_url(f"{url}?mode=ro")
    headers = {"Authorization": f"Bearer {token}"}
    with AttackClient(create_app(memory, Settings(rate_limit=0))) as client:
        for n in range(3):
            expect(f"ro whoami {n}", client.get("/v1/whoami", headers=headers), 200)
            expect(f"ro read {n}", client.post("/v1/memory/read", headers=headers,
                                               json={"scope": "user", "key": "k"}), 200)
        client.portal.call(memory.aclose)
    no_deviations("ro ")


def test_bookkeeping_failures_are_logged_not_raised() -> None:
    world = attack_world(seed=False)
    backend = world.app.state.flowmem.tokens

    async def failing(*_: Any, **__: Any) -> None:
        raise RuntimeError("the disk is on fire")

    backend._stamp = failing
    backend._touched.clear()
    expect("stamp failure answers 200", world.call("owner", "GET", "/v1/whoami"), 200)
    world.run(backend.flush)
    backend._pending["x" * 64] = 1.0
    world.run(backend.flush)  # logged, not raised
    case("stamp failure left nothing pending", not backend._pending)
    no_deviations("stamp ")


def test_a_slow_stamp_never_delays_the_request() -> None:
    world = attack_world(seed=False)
    backend = world.app.state.flowmem.tokens

    async def slow(*_: Any, **__: Any) -> None:
        await asyncio.sleep(2)

    backend._stamp = slow
    backend._touched.clear()
    started = time.perf_counter()
    expect("slow stamp 200", world.call("owner", "GET", "/v1/whoami"), 200)
    case("slow stamp not awaited", time.perf_counter() - started < 1.5)
    no_deviations("slow stamp ")


def test_a_stopped_session_refuses_an_admins_edits_too() -> None:
    world = attack_world()
    sid = world.session_id
    expect("stopped stop", world.call("owner", "POST", f"/v1/sessions/{sid}/stop", {}), 200)
    position = world.call("admin", "GET", f"/v1/sessions/{sid}/messages").json()["data"][
        "messages"][0]["position"]
    expect("stopped admin edit", world.call(
        "admin", "PUT", f"/v1/sessions/{sid}/messages/{position}",
        {"message": {"role": "user", "content": "rewritten"}}), 409, "session_stopped")
    expect("stopped admin delete", world.call(
        "admin", "DELETE", f"/v1/sessions/{sid}/messages/{position}"), 409, "session_stopped")
    expect("stopped admin turn", world.call(
        "admin", "POST", f"/v1/sessions/{sid}/turns",
        {"messages": [{"role": "user", "content": "x"}]}), 409, "session_stopped")
    left = world.call("admin", "GET", f"/v1/sessions/{sid}/messages").json()["data"]["messages"]
    case("stopped transcript intact", [m["message"]["content"] for m in left] == ["hello"])
    no_deviations("stopped ")


def test_two_host_headers_are_refused() -> None:
    for settings in (Settings(rate_limit=0),
                     Settings(rate_limit=0, allowed_hosts=("localhost", "testserver"))):
        world = attack_world(settings, seed=False)
        twice = [("host", "evil.example"), ("host", "localhost")]
        response = world.client.get("/healthz", headers=twice)
        expect("host twice", response, 400, "host_repeated")
        response = world.client.get("/healthz", headers=[("host", "localhost"),
                                                         ("host", "localhost")])
        expect("host same twice", response, 400, "host_repeated")
        expect("host once", world.client.get("/healthz"), 200)
    no_deviations("host ")
