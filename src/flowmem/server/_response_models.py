"""Response bodies (pydantic): what ``/openapi.json`` says each door answers.

Responses are the envelopes of :mod:`._responses`: :class:`Ok` wraps a
result, :class:`Page` a paged one, each described exactly (no other keys).
The request bodies are in :mod:`._models`.
"""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from ..access import SESSION_STATUSES
from ._budget_fields import Omitted, Tokens
from ._models import Scope

__all__ = [
    "AppendOut",
    "DeleteOut",
    "ErasureCounts",
    "ErasureOut",
    "Health",
    "HistoryOut",
    "MessagePage",
    "Ok",
    "Page",
    "Pagination",
    "PositionedMessage",
    "ReadOut",
    "SessionOut",
    "TurnOut",
    "WhoAmI",
    "WriteOut",
]

T = TypeVar("T")
Status = Literal[SESSION_STATUSES]  # type: ignore[valid-type]


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SessionOut(_Out):
    """A session. ``viewers`` is shown to those who manage it, else ``[]``."""

    id: str
    owner: str | None
    title: str
    viewers: list[str]
    status: Status = Field(description="`idle` (no turn yet), `completed` (a turn finished), "
                                       "`stopped` (STORE-11/12).")
    created_at: float
    updated_at: float


class PositionedMessage(_Out):
    """A stored message (canonical shape) and its stable position."""

    position: int = Field(description="Its stable position (`-1`: a placeholder the repair of "
                                      "a budgeted read added for a call still waiting; not "
                                      "stored).")
    message: dict[str, Any]


class Rendered(_Out):
    """The page as a provider takes it (sendable after MEM-5's repairs); ``dropped``
    counts what the repairs and the target removed."""

    format: str
    dropped: int
    output: list[dict[str, Any]] | dict[str, Any]


class MessagePage(_Out):
    """Messages oldest first; ``before`` is the cursor of the next older page (``null``
    after a budgeted read, which also says ``tokens`` and ``omitted``)."""

    messages: list[PositionedMessage]
    before: int | None
    rendered: Rendered | None = None
    tokens: Tokens = None
    omitted: Omitted = None


class _Report(_Out):
    """What an append changed (MEM-14) and the newest messages after it."""

    count: int
    appended: int
    appended_any: bool
    replaced: int = Field(description="Late tool results stored in place of their "
                                      "placeholders (MEM-10).")
    dropped_results: int = Field(description="Tool results dropped as duplicates (MEM-1).")
    dropped_turns: int = Field(description="Assistant turns dropped: every call id they "
                                           "declare was already declared (MEM-2).")
    healed: int = Field(description="Placeholders inserted for unanswered calls (MEM-3).")
    messages: list[PositionedMessage]
    before: int | None


class TurnOut(_Report):
    """The MEM-14 report and the newest messages after the append."""

    refused: bool


class _Where(_Out):
    scope: Scope
    resolved_scope_id: str
    refused: bool = Field(description="The scope was refused (MEM-6/MEM-13): the neutral "
                                      "MEM-7 result, nothing read or stored.")


class ReadOut(_Where):
    """A read; refused: ``found`` false and the default. ``written_by``: who last wrote
    a shared-scope value through the service (``null``: unknown)."""

    value: Any = None
    found: bool
    written_by: str | None


class WriteOut(_Where):
    """A write; refused: ``ok`` false."""

    ok: bool


class DeleteOut(_Where):
    """A delete; refused: ``ok`` false. A missing key is ``ok`` and not ``found``."""

    ok: bool
    found: bool


class AppendOut(_Report, _Where):
    """An append (MEM-14); refused: count 0, an empty buffer."""


class HistoryOut(MessagePage, _Where):
    """A page of a conversation, oldest first; refused: empty. With ``format``,
    ``rendered`` holds the page in that provider's shape. A budgeted read
    (``max_tokens``) also says ``tokens`` and ``omitted``; its ``before`` is ``null``."""


class WhoAmI(_Out):
    """The caller as the token says."""

    user_id: str | None
    admin: bool
    anonymous: bool


class Health(_Out):
    """The service is up."""

    status: Literal["ok"]


class Pagination(_Out):
    """API-5: exactly these four keys, in this order; ``has_more`` = offset + limit < total."""

    total: int
    limit: int
    offset: int
    has_more: bool


class ErasureCounts(_Out):
    """What an erasure deleted (or, a dry run, would delete), by kind."""

    conversations: int
    values: int
    messages: int
    idempotency_records: int
    sessions: int
    viewer_links: int
    tokens: int
    writer_records: int


class ErasureOut(_Out):
    """An erasure's receipt: for whom, when (ISO 8601, UTC), whether a dry run, the counts
    and their total. Never any content."""

    user_id: str
    erased_at: str
    dry_run: bool
    counts: ErasureCounts
    total: int


class Ok(_Out, Generic[T]):
    """The result envelope."""

    success: Literal[True]
    data: T


class Page(_Out, Generic[T]):
    """The paged envelope (API-5, API-6)."""

    success: Literal[True]
    data: T
    pagination: Pagination
