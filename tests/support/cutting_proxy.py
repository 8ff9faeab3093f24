"""A TCP proxy that loses the answer to one command: it forwards the client's packet that
holds :attr:`CommitCutter.trigger` (after one that held :attr:`~CommitCutter.marker`, on
the same connection), then closes both sides before the server's answer returns — the
server ran the command, the client never learns it. Threads, so both faces can use it."""

from __future__ import annotations

import socket
import threading

from tcp_proxy import Proxy

__all__ = ["CommitCutter"]


class CommitCutter(Proxy):
    """Forwards to ``host:port``; once :attr:`marker` is set, the first client packet
    holding ``COMMIT`` on a connection that sent the marker is forwarded, then both
    sides are closed before the answer returns."""

    def __init__(self, host: str, port: int) -> None:
        self.marker = b""
        self.trigger = b"COMMIT"  # the command whose answer is lost
        self.cut = threading.Event()
        super().__init__(host, port)

    def connection(self) -> dict[str, bool]:
        return {"marked": False}

    def forward(self, data: bytes, source: socket.socket, sink: socket.socket,
                state: dict[str, bool], from_client: bool) -> bool:
        if not from_client:
            if state.get("severed"):  # this connection's answers are no longer passed on
                return False
            sink.sendall(data)
            return True
        cutting = False
        if self.marker and not self.cut.is_set():
            state["marked"] = state["marked"] or self.marker in data
            cutting = state["marked"] and self.trigger in data
        if cutting:  # severed before the server can answer: its answer is never passed on
            state["severed"] = True
            self.cut.set()
        sink.sendall(data)
        return not cutting
