"""A TCP proxy the tests put between a store and its server, on threads (both faces).

:class:`Proxy` listens on 127.0.0.1 (a free port), opens one upstream connection
per client connection and pumps each direction on its own thread; a subclass
sees every chunk on its way (:meth:`Proxy.forward`) to count, delay or cut it.
:meth:`Proxy.close` drops every connection and the port (reconnects are refused).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = ["Proxy", "through"]


class Proxy:
    """Forwards every connection made to :attr:`port` to ``host:port``."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, name=type(self).__name__, daemon=True).start()

    def connection(self) -> Any:
        """The state one client connection keeps (passed to :meth:`forward`)."""
        return None

    def forward(self, data: bytes, source: socket.socket, sink: socket.socket,
                state: Any, from_client: bool) -> bool:
        """Pass ``data`` on; ``False`` ends this direction of the connection."""
        sink.sendall(data)
        return True

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
            state = self.connection()
            for pair in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pump, args=(*pair, state), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_client: bool,
              state: Any) -> None:
        try:
            while data := source.recv(65536):
                if not self.forward(data, source, sink, state, from_client):
                    return
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Drop every proxied connection and stop listening."""
        with self._lock:
            self._closed = True
            sockets, self._sockets = self._sockets, []
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self._listener.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def through(proxy: Proxy, url: str) -> str:
    """``url`` with its host and port replaced by the proxy's."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    at = f"{netloc[0]}@" if len(netloc) == 2 else ""
    return urlunsplit((parts.scheme, f"{at}127.0.0.1:{proxy.port}", parts.path,
                       parts.query, parts.fragment))
