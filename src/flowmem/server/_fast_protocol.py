"""uvicorn's httptools protocol (llhttp, in C) with flowmem's deadlines and coalesced
writes (:mod:`.protocols`); importing this module needs ``httptools``."""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ._protocols import _Deadlines

__all__ = ["FastDeadlineProtocol"]


class FastDeadlineProtocol(_Deadlines, HttpToolsProtocol):  # type: ignore[misc]
    """uvicorn's httptools protocol, with the head deadline and coalesced writes."""
