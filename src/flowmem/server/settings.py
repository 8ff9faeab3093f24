"""The service's settings: limits, page sizes, access hooks."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..access import AccessHook
from .limits import Limits

__all__ = ["Settings"]


@dataclass(frozen=True, slots=True)
class Settings:
    """How one app behaves.

    ``limits`` are enforced with 413/400 and documented in ``/openapi.json``.
    ``hooks`` are :data:`~flowmem.access.AccessHook` callables asked after the
    access rules allow an action: they can only add denials (MEM-15).
    ``session_window`` is the ``max_messages`` of a session's conversation
    when a turn names none (``None``: unbounded). ``echo`` is how many of the
    newest messages an append answers with.
    """

    limits: Limits = field(default_factory=Limits)
    hooks: tuple[AccessHook, ...] = ()
    session_window: int | None = None
    page_size: int = 50
    max_page_size: int = 500
    echo: int = 50
    max_viewers: int = 100
