"""The hardening findings against a real ``flowmem serve`` process (sockets, not ASGI calls).

The same cases as ``test_sec_hardening.py``, where a live process matters: a
hostile body must not stall the event loop that answers ``/healthz``; an
event stream must end when its token is revoked by another process or
expires; the rate limit, the Host gate and the dialect refusals on the wire.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from attack_support import attack_http, case, expect, no_deviations
from server_support import flowmem, free_port, serving
from test_sec_hardening import deep_body

pytestmark = [pytest.mark.server, pytest.mark.processes]


def _token(store: str, *args: str) -> str:
    done = subprocess.run(flowmem("token", "create", *args, "--store", store),
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


def _raw(port: int, request: bytes, body: bytes = b"") -> bytes:
    """Send a request head (and body) on a socket; the answer's first line and headers."""
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.sendall(request)
        with contextlib.suppress(OSError):  # refused before the body was read: closed
            sock.sendall(body)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
        return answer


def test_live_an_unauthenticated_hostile_body_never_stalls_the_service(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'freeze.db'}"
    port = free_port()
    body = deep_body(8 * 1024 * 1024 - 64)
    head = (b"POST /v1/memory/write HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
    with serving(store, port, "--rate-limit", "0"), \
            attack_http(f"http://127.0.0.1:{port}") as http:
        answers: list[bytes] = []
        senders = [threading.Thread(target=lambda: answers.append(_raw(port, head, body)))
                   for _ in range(3)]
        for sender in senders:
            sender.start()
        worst = 0.0
        while any(s.is_alive() for s in senders):
            started = time.monotonic()
            expect("attack healthz during hostile bodies", http.get("/healthz"), 200)
            worst = max(worst, time.monotonic() - started)
            time.sleep(0.05)
        for sender in senders:
            sender.join(30)
        case("attack hostile bodies answered 401",
             len(answers) == 3 and all(a.startswith(b"HTTP/1.1 401") for a in answers),
             repr([a[:40] for a in answers]))
        case("attack /healthz never stalled", worst < 2.0, f"worst {worst:.2f} s")
    no_deviations("attack ")


def _listen(base: str, path: str, token: str, into: list[tuple[str, Any]],
            opened: threading.Event) -> None:
    with httpx.Client(base_url=base, timeout=30) as client, \
            client.stream("GET", path, headers={"Authorization": f"Bearer {token}"}) as answer:
        buffer = ""
        for chunk in answer.iter_text():
            buffer += chunk
            *blocks, buffer = buffer.split("\n\n")
            for block in blocks:
                fields = dict(line.split(": ", 1) for line in block.splitlines()
                              if ": " in line and not line.startswith(":"))
                if "event" in fields:
                    into.append((fields["event"], fields.get("data")))
                    opened.set()


def _stream_until_end(base: str, path: str, token: str, act: Any) -> tuple[list[Any], float]:
    events: list[tuple[str, Any]] = []
    opened = threading.Event()
    listener = threading.Thread(target=_listen, args=(base, path, token, events, opened))
    listener.start()
    assert opened.wait(15)
    acted = act()
    listener.join(20)
    return events, time.monotonic() - acted


def test_live_an_event_stream_ends_when_its_token_is_revoked_or_expires(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'stream.db'}"
    owner = _token(store, "--user", "alice")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with serving(store, port, "--rate-limit", "0"), attack_http(base) as http:
        auth = {"Authorization": f"Bearer {owner}"}
        sid = http.post("/v1/sessions", json={"title": "t"}, headers=auth).json()["data"]["id"]
        path = f"/v1/sessions/{sid}/events?timeout=60"
        revoked = _token(store, "--user", "alice")
        token_id = hash_id(revoked)

        def revoke() -> float:
            subprocess.run(flowmem("token", "revoke", token_id, "--store", store), check=True,
                           capture_output=True)
            return time.monotonic()

        events, took = _stream_until_end(base, path, revoked, revoke)
        case("attack revoked stream ended", bool(events) and events[-1][0] == "end"
             and "unauthenticated" in events[-1][1], repr(events[-2:]))
        case("attack revoked stream ended at once", took < 5, f"{took:.1f} s")
        expiring = _token(store, "--user", "alice", "--expires", "3s")
        events, took = _stream_until_end(base, path, expiring, time.monotonic)
        case("attack expired stream ended", bool(events) and events[-1][0] == "end"
             and "unauthenticated" in events[-1][1], repr(events[-2:]))
        case("attack expired stream ended at expiry", took < 8, f"{took:.1f} s")
    no_deviations("attack ")


def hash_id(token: str) -> str:
    from flowmem.service._tokens import TokenBackend

    return TokenBackend.token_id(token)


def test_live_rate_limit_host_and_dialects(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'wire.db'}"
    token = _token(store, "--user", "alice")
    port = free_port()
    with serving(store, port, "--rate-limit", "0.01", "--burst", "3"), \
            attack_http(f"http://127.0.0.1:{port}") as http:
        statuses = [http.get("/v1/whoami", headers={"Authorization": f"{scheme} {token}"})
                    .status_code for scheme in ("Bearer", "bearer", "BEARER", "Bearer ",
                                                "bEARER")]
        case("attack one bucket per token", statuses == [200, 200, 200, 429, 429],
             str(statuses))
        twice = _raw(port, b"GET /healthz HTTP/1.1\r\nHost: evil.example\r\n"
                           b"Host: localhost\r\n\r\n")
        case("attack Host twice is 400", twice.startswith(b"HTTP/1.1 400"), repr(twice[:60]))
    other = _token(store, "--user", "bob")
    with serving(store, free_port(), "--rate-limit", "0") as http:
        auth = {"Authorization": f"Bearer {other}"}
        for dialect, messages in (("responses", [{"type": []}]),
                                  ("openai", [{"role": {}, "content": "x"}])):
            expect(f"attack dialect {dialect}", http.post(
                "/v1/memory/append", headers=auth, json={
                    "scope": "user", "key": "c", "format": dialect, "messages": messages}),
                400, "invalid_message")
    no_deviations("attack ")


def test_live_a_read_only_store_answers_reads(tmp_path: Path) -> None:
    path = tmp_path / "ro.db"
    token = _token(f"sqlite:///{path}", "--user", "alice")
    with serving(f"sqlite:///{path}?mode=ro", free_port()) as http:
        auth = {"Authorization": f"Bearer {token}"}
        for n in range(3):
            expect(f"attack ro whoami {n}", http.get("/v1/whoami", headers=auth), 200)
    no_deviations("attack ro")
