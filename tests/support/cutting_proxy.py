"""A TCP proxy that loses the answer to one command: it forwards the client's packet that
holds :attr:`CommitCutter.trigger` (after one that held :attr:`~CommitCutter.marker`, on
the same connection), then closes both sides before the server's answer returns — the
server ran the command, the client never learns it. Threads, so both faces can use it."""

from __future__ import annotations

import contextlib
import socket
import threading

__all__ = ["CommitCutter"]


class CommitCutter:
    """Forwards to ``host:port``; once :attr:`marker` is set, the first client packet
    holding ``COMMIT`` on a connection that sent the marker is forwarded, then both
    sides are closed before the answer returns."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.marker = b""
        self.trigger = b"COMMIT"  # the command whose answer is lost
        self.cut = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            severed = threading.Event()  # this connection's answers are no longer passed on
            threading.Thread(target=self._pump, args=(client, server, True, severed),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False, severed),
                             daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, upward: bool,
              severed: threading.Event) -> None:
        marked = False
        try:
            while data := source.recv(65536):
                if not upward:
                    if severed.is_set():
                        return
                    target.sendall(data)
                    continue
                cutting = False
                if self.marker and not self.cut.is_set():
                    marked = marked or self.marker in data
                    cutting = marked and self.trigger in data
                if cutting:
                    # severed before the server can answer: its answer is never passed on
                    severed.set()
                    self.cut.set()
                target.sendall(data)
                if cutting:
                    source.shutdown(socket.SHUT_RDWR)
                    source.close()
                    return
        except OSError:
            pass
        finally:
            for sock in (source, target):
                with contextlib.suppress(OSError):
                    sock.close()

    def close(self) -> None:
        self._listener.close()
