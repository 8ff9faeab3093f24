"""The server's protocols: what one turn of the event loop writes goes out as ONE write
(uvicorn writes a response head and its body separately), in order, before any close."""

from __future__ import annotations

import asyncio
import socket
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from flowmem import AsyncMemory
from flowmem.server import Settings, create_app
from flowmem.server._protocols import CoalescingTransport
from server_support import flowmem, live_server


class _Sink(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]


async def _pair() -> tuple[asyncio.Transport, socket.socket, list[bytes]]:
    """A real socket transport whose writes are recorded, and the peer's socket."""
    ours, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_connection(_Sink, sock=ours)
    writes: list[bytes] = []
    real_write = transport.write

    def recording(data: Any) -> None:
        writes.append(bytes(data))
        real_write(data)

    transport.write = recording  # type: ignore[method-assign]
    theirs.settimeout(5)
    return transport, theirs, writes  # type: ignore[return-value]


def _read_all(peer: socket.socket) -> bytes:
    chunks = []
    while chunk := peer.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_writes_in_one_turn_go_out_as_one_write() -> None:
    async def scenario() -> list[bytes]:
        transport, peer, writes = await _pair()
        coalescing = CoalescingTransport(transport, asyncio.get_running_loop())
        coalescing.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        coalescing.write(memoryview(b"ok"))
        assert writes == []  # held until the turn ends
        await asyncio.sleep(0)
        coalescing.close()
        await asyncio.sleep(0)
        assert _read_all(peer) == b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
        peer.close()
        return writes

    assert asyncio.run(scenario()) == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"]


def test_a_close_sends_what_is_held_first() -> None:
    async def scenario() -> bytes:
        transport, peer, _ = await _pair()
        coalescing = CoalescingTransport(transport, asyncio.get_running_loop())
        coalescing.writelines([b"last ", b"words"])
        coalescing.close()
        await asyncio.sleep(0.01)
        try:
            return _read_all(peer)
        finally:
            peer.close()

    assert asyncio.run(scenario()) == b"last words"


def test_nothing_is_held_past_its_turn() -> None:
    async def scenario() -> list[bytes]:
        transport, peer, writes = await _pair()
        coalescing = CoalescingTransport(transport, asyncio.get_running_loop())
        for part in (b"event: one\n\n", b"event: two\n\n"):  # a stream: one write per turn
            coalescing.write(part)
            await asyncio.sleep(0)
        assert coalescing.is_closing() is False  # the rest is the real transport's
        coalescing.close()
        peer.close()
        return writes

    assert asyncio.run(scenario()) == [b"event: one\n\n", b"event: two\n\n"]


@pytest.mark.parametrize("http", ["flowmem.server._protocols:DeadlineProtocol",
                                  "flowmem.server._fast_protocol:FastDeadlineProtocol"])
def test_each_protocol_answers_turns_whole_on_one_connection(tmp_path: Path, http: str) -> None:
    """End to end on h11 (the fallback) and httptools: the coalesced head and body of each
    answer arrive whole, turn after turn on one keep-alive connection."""
    store = f"sqlite:///{tmp_path / 'p.db'}"
    secret = subprocess.run(flowmem("token", "create", "--user", "ana", "--store", store),
                            capture_output=True, text=True, check=True).stdout.strip()
    app = create_app(AsyncMemory.from_url(store), Settings(rate_limit=0.0))
    with live_server(app, http=http) as base, httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {secret}"}) as client:
        sid = client.post("/v1/sessions", json={"title": "p"}).json()["data"]["id"]
        for turn in range(3):
            answer = client.post(f"/v1/sessions/{sid}/turns", json={
                "messages": [{"role": "user", "content": f"turn {turn} \u00e9"}]})
            assert answer.status_code == 200
            assert answer.headers["content-length"] == str(len(answer.content))
        echoed = answer.json()["data"]["messages"]
        assert [e["message"]["content"] for e in echoed] == [f"turn {t} \u00e9" for t in range(3)]
        assert answer.content.isascii()
