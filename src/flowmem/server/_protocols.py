"""uvicorn's HTTP protocols as ``flowmem serve`` runs them: connection deadlines and
coalesced writes.

uvicorn closes an idle keep-alive connection after ``timeout_keep_alive``,
but any byte resets that timer and a connection that never completes a
request head has no deadline at all, so idle and slow ("slowloris")
connections could stay open forever. The protocols here close a connection
that has not delivered a complete request head within :data:`HEAD_DEADLINE`
seconds of opening or of its previous response; the body gate bounds the
body the same way (``Settings.read_timeout``). At shutdown, an open event
stream is asked to end, so in-flight requests finish and streams do not hold
the service up.

uvicorn writes a response's head and its body with two ``write`` calls, and
the loop sends each at once: two segments and two wake-ups of the client per
answer, where the head's send alone took 15 % of the server's CPU at 32
clients. :class:`CoalescingTransport` gathers what one turn of the event
loop writes and sends it once, at the end of that turn (before a close).

:func:`protocol_path` names the protocol class by import path, which is what
worker processes (:mod:`.workers`) are given: uvicorn's httptools protocol
(llhttp, in C; the ``server`` extra installs it) with both, else h11's.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

from uvicorn.protocols.http.h11_impl import H11Protocol

from ._routes_events import STOP_STREAM

__all__ = ["HEAD_DEADLINE", "CoalescingTransport", "DeadlineProtocol", "protocol",
           "protocol_path"]

HEAD_DEADLINE: Final = 8.0


if TYPE_CHECKING:
    _Protocol = H11Protocol  # both of uvicorn's protocols have what the mixin uses
else:
    _Protocol = object


class CoalescingTransport:
    """A transport whose writes within one turn of the event loop go out as one write.

    Everything else is the wrapped transport's own. A close sends what is held
    first; nothing is held past the turn it was written in.
    """

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(bytes(data))

    def writelines(self, chunks: Iterable[bytes | bytearray | memoryview]) -> None:
        for chunk in chunks:
            self.write(chunk)

    def flush(self) -> None:
        """Send what is held (one write)."""
        if self._held:
            data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
            self._held = []
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _Deadlines(_Protocol):
    """Closes connections that send no request head in time (mixed into a uvicorn protocol)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        coalescing = CoalescingTransport(transport, asyncio.get_running_loop())
        super().connection_made(coalescing)  # type: ignore[arg-type]
        self._seen: Any = None
        self._deadline: asyncio.TimerHandle | None = None
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._note_request()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self._note_request():
            self._arm()

    def shutdown(self) -> None:
        # An event stream never completes by itself: ask it to end (routes_events).
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            stop = (cycle.scope.get("state") or {}).get(STOP_STREAM)
            if callable(stop):
                stop()
        super().shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        super().connection_lost(exc)

    def _note_request(self) -> bool:
        """Whether a new request head has arrived (then the deadline is lifted)."""
        cycle = self.cycle
        if cycle is not None and cycle is not self._seen and not cycle.response_complete:
            self._seen = cycle
            self._cancel()
            return True
        return False

    def _arm(self) -> None:
        self._cancel()
        if not self.transport.is_closing():
            self._deadline = self.loop.call_later(HEAD_DEADLINE, self._expire)

    def _cancel(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()


class DeadlineProtocol(_Deadlines, H11Protocol):
    """uvicorn's h11 protocol (pure Python), with the head deadline."""


@functools.cache
def protocol_path() -> str:
    """The import path of the protocol ``flowmem serve`` uses (see the module notes)."""
    if importlib.util.find_spec("httptools") is not None:
        return "flowmem.server._fast_protocol:FastDeadlineProtocol"
    return f"{__name__}:DeadlineProtocol"  # pragma: no cover - httptools is in the server extra


def protocol() -> type[asyncio.Protocol]:
    """The protocol class :func:`protocol_path` names."""
    module, _, name = protocol_path().partition(":")
    chosen: type[asyncio.Protocol] = getattr(importlib.import_module(module), name)
    return chosen
