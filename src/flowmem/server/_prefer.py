"""``Prefer: return=minimal`` (RFC 7240) on the append doors: no echo of the conversation.

An append answers its MEM-14 report and, by default, the newest messages of
the conversation after it (``Settings.echo`` of them), which costs a second
read of the store. A client that keeps its own copy, or only needs to know
the turn was stored, sends ``Prefer: return=minimal``: the answer then has the
same fields with ``messages: []`` and ``before: null``, the store is read no
second time, and the response says ``Preference-Applied: return=minimal``.
Any other preference is ignored, as RFC 7240 asks.
"""

from __future__ import annotations

from typing import Annotated, Final

from fastapi import Header

from ._responses import AsciiJSONResponse

__all__ = ["APPLIED_HEADER", "MINIMAL", "PreferHeader", "mark_minimal", "wants_minimal"]

MINIMAL: Final = "return=minimal"
APPLIED_HEADER: Final = "Preference-Applied"

PreferHeader = Annotated[
    str | None,
    Header(alias="Prefer",
           description="`return=minimal`: answer without echoing the conversation "
                       "(`messages: []`, `before: null`; one store read less)."),
]


def wants_minimal(header: str | None) -> bool:
    """Whether a ``Prefer`` header asks for ``return=minimal`` (case and spaces aside)."""
    if not header:
        return False
    for preference in header.split(","):
        name, _, value = preference.split(";", 1)[0].partition("=")
        if name.strip().lower() == "return" and value.strip().strip('"').lower() == "minimal":
            return True
    return False


def mark_minimal(response: AsciiJSONResponse, minimal: bool) -> AsciiJSONResponse:
    """Say on the response that the minimal return was applied."""
    if minimal:
        response.headers[APPLIED_HEADER] = MINIMAL
    return response
