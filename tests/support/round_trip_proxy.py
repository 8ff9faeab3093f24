"""A TCP proxy that counts a client's round trips: the honest measure of network waits.

Every byte between the client and the server passes through the proxy; a
*round trip* is counted each time the client sends after having received
something (the first send of a connection counts too). Pipelined statements
the client sends before reading any answer are one round trip, a statement
whose answer the client waits for before sending the next is one each — what
a client on a distant network pays in latency. The counts are per proxy (all
its connections); read :attr:`CountingProxy.round_trips` before and after an
operation on an already open connection.

Threads, not asyncio, so the proxy runs beside both faces of a store.
"""

from __future__ import annotations

import socket
import threading
import time

from tcp_proxy import Proxy, through

__all__ = ["CountingProxy", "through"]


class _Link:
    """One client connection and its upstream: whose turn it was to speak."""

    def __init__(self) -> None:
        self.client_spoke_last = False


class CountingProxy(Proxy):
    """Forwards to ``host:port``, counting round trips; ``delay`` seconds are added before
    each answer is forwarded (a network's round trip)."""

    def __init__(self, host: str, port: int, delay: float = 0.0) -> None:
        self.delay = delay
        self.round_trips = 0
        self._counting = threading.Lock()
        super().__init__(host, port)

    def connection(self) -> _Link:
        return _Link()

    def forward(self, data: bytes, source: socket.socket, sink: socket.socket,
                state: _Link, from_client: bool) -> bool:
        with self._counting:  # counted before forwarding: the answer comes after
            if from_client and not state.client_spoke_last:
                self.round_trips += 1
            state.client_spoke_last = from_client
        if self.delay and not from_client:
            time.sleep(self.delay)
        sink.sendall(data)
        return True

    def count(self) -> int:
        """Round trips so far (all connections)."""
        with self._counting:
            return self.round_trips
