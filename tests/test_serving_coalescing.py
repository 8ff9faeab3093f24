"""The server's transport: what one turn of the event loop writes goes out as ONE write
(uvicorn writes a response head and its body separately), in order, before any close."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from flowmem.server.protocols import CoalescingTransport


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
