"""The service's settings: limits, page sizes, access hooks, the gates."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..access import AccessHook, Level
from ._limits import Limits

__all__ = ["Settings"]


@dataclass(frozen=True, slots=True)
class Settings:
    """How one app behaves.

    ``limits`` are enforced with 400 and documented in ``/openapi.json``.
    ``hooks`` are :data:`~flowmem.access.AccessHook` callables asked after the
    access rules allow an action: they can only add denials (MEM-15).
    ``session_window`` is the ``max_messages`` of a session's conversation
    when a turn names none (``None``: unbounded; an operator's policy, so it
    applies to every turn). ``echo`` is how many of the newest messages an
    append answers with; ``page_size`` the default ``limit`` of a paged door
    (clamped to 100, API-6). ``read_timeout`` bounds the seconds a request
    body may take to arrive. ``allowed_hosts`` (``None``: any) are the
    ``Host`` names answered (``flowmem serve`` sets the loopback names when
    bound to loopback). ``anonymous`` is what a caller without a token may
    do on the shared scopes (``None``: nothing — every ``/v1`` route then
    needs a token). ``rate_limit`` requests a second per token on average,
    in bursts of ``burst`` (``0``: no limit). ``metrics_public``: ``GET /metrics``
    answers without a token (else it needs an admin token). ``fast_turns``: a
    well-formed append turn is served without FastAPI's per-request plumbing
    (:mod:`.fastpath`; the same functions, the same answers). ``otel``:
    FastAPI's own OpenTelemetry instrumentation (FastAPI 0.165 and later: traces,
    metrics and logs through an OpenTelemetry provider the process configured);
    off by default — the service counts itself on ``GET /metrics`` — because
    FastAPI looks for a configured provider on every request (about 11 µs).
    ``sweep_interval``: seconds between background sweeps of expired data
    (:mod:`flowmem.service._sweeper`; ``None``: none), ``sweep_batch`` what
    one sweep transaction deletes at most.
    """

    limits: Limits = field(default_factory=Limits)
    hooks: tuple[AccessHook, ...] = ()
    session_window: int | None = None
    page_size: int = 50
    echo: int = 50
    max_viewers: int = 100
    read_timeout: float = 8.0
    allowed_hosts: tuple[str, ...] | None = None
    anonymous: Level | None = None
    rate_limit: float = 50.0
    burst: int = 100
    metrics_public: bool = False
    fast_turns: bool = True
    otel: bool = False
    sweep_interval: float | None = None
    sweep_batch: int = 100
