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

import contextlib
import socket
import threading
import time
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

__all__ = ["CountingProxy", "through"]


class _Link:
    """One client connection and its upstream: whose turn it was to speak."""

    def __init__(self) -> None:
        self.client_spoke_last = False


class CountingProxy:
    """Listens on 127.0.0.1 (a free port) and forwards to ``host:port``; ``delay``
    seconds are added before each answer is forwarded (a network's round trip)."""

    def __init__(self, host: str, port: int, delay: float = 0.0) -> None:
        self.upstream = (host, port)
        self.delay = delay
        self.round_trips = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, name="round-trip-proxy", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._closed:
                    client.close()
                    server.close()
                    return
                self._sockets += [client, server]
            link = _Link()
            threading.Thread(target=self._pump, args=(client, server, link, True),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, link, False),
                             daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, link: _Link,
              from_client: bool) -> None:
        try:
            while data := source.recv(65536):
                with self._lock:  # counted before forwarding: the answer comes after
                    if from_client and not link.client_spoke_last:
                        self.round_trips += 1
                    link.client_spoke_last = from_client
                if self.delay and not from_client:
                    time.sleep(self.delay)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def count(self) -> int:
        """Round trips so far (all connections)."""
        with self._lock:
            return self.round_trips

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets, self._sockets = self._sockets, []
        self._listener.close()
        for sock in sockets:
            sock.close()

    def __enter__(self) -> CountingProxy:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def through(proxy: CountingProxy, url: str) -> str:
    """``url`` with its host and port replaced by the proxy's."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    at = f"{netloc[0]}@" if len(netloc) == 2 else ""
    return urlunsplit((parts.scheme, f"{at}127.0.0.1:{proxy.port}", parts.path,
                       parts.query, parts.fragment))
