"""The fields of token budgets and compaction at the doors (the schema's words for them)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import Query
from pydantic import Field, StrictBool, StrictInt

from ._limits import Limits

__all__ = ["COUNTER_NAMES", "CounterField", "CounterQuery", "KeepSystem", "KeepSystemQuery",
           "MaxTokens", "MaxTokensQuery", "Omitted", "Tokens"]

_DEFAULTS = Limits()

COUNTER_NAMES = Literal["approximate", "o200k_base", "cl100k_base", "p50k_base", "r50k_base"]
_MAX_TOKENS = ("A token budget: the newest whole turns whose count, in `format`, is within "
               "it (sendable; leading system messages kept and counted). Not with the "
               "page's other bounds (`limit`, `last`, `offset`, `before`); the answer has "
               "`tokens` and `omitted`, and no `before` cursor (docs/context.md).")
_COUNTER = ("How a budgeted read counts: `approximate` (the default) or a tiktoken "
            "encoding the service has cached (else 400 `counter_unavailable`).")
_KEEP_SYSTEM = "A budgeted read keeps and counts the leading system messages (default true)."

MaxTokens = Annotated[StrictInt | None, Field(ge=0, le=_DEFAULTS.max_budget_tokens,
                                              description=_MAX_TOKENS)]
CounterField = Annotated[COUNTER_NAMES | None, Field(description=_COUNTER)]
KeepSystem = Annotated[StrictBool | None, Field(description=_KEEP_SYSTEM)]
# the same, as query parameters (a session's GET history)
MaxTokensQuery = Annotated[int | None, Query(ge=0, le=_DEFAULTS.max_budget_tokens,
                                             description=_MAX_TOKENS)]
CounterQuery = Annotated[COUNTER_NAMES | None, Query(description=_COUNTER)]
KeepSystemQuery = Annotated[bool | None, Query(description=_KEEP_SYSTEM)]

Tokens = Annotated[int | None, Field(description="A budgeted read: the tokens its messages "
                                                   "hold, counted in `format`.")]
Omitted = Annotated[int | None, Field(description="A budgeted read: the stored messages it "
                                                  "left out.")]
