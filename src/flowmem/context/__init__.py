"""Fitting a conversation into a model's context window: token budgets and compaction.

- **Budgets on read** (:func:`fit`, and ``max_tokens=`` on
  :meth:`flowmem.Memory.history`, :class:`flowmem.AsyncMemory`, the HTTP
  history doors, the CLI and ``flowmem.formats.to_*``): the newest whole
  turns that fit, sendable, counted in the dialect they will be sent in.
- **Counters** (:class:`TokenCounter`): :data:`approximate` (the default) and
  :class:`TiktokenCounter` (OpenAI's encodings, when tiktoken and its cached
  encoding file are here; :func:`tiktoken_unavailable` says why not).
- **Compaction** (:meth:`flowmem.Memory.compact`): everything older than a
  kept tail replaced by one summary, in one atomic edit.

Pure: no I/O (the store calls are generators run by the faces). See
``docs/context.md``.
"""

from __future__ import annotations

from ._budget import Fitted, fit
from ._compact import (
    COMPACTED,
    CompactionConflict,
    CompactionPlan,
    CompactResult,
    compact_entries,
    is_summary,
    plan_compaction,
)
from ._counters import (
    DOCUMENT_TOKENS,
    IMAGE_TOKENS,
    ApproximateCounter,
    TiktokenCounter,
    TokenCounter,
    TokenizerUnavailable,
    approximate,
    tiktoken_unavailable,
)

__all__ = [
    "COMPACTED",
    "DOCUMENT_TOKENS",
    "IMAGE_TOKENS",
    "ApproximateCounter",
    "CompactResult",
    "CompactionConflict",
    "CompactionPlan",
    "Fitted",
    "TiktokenCounter",
    "TokenCounter",
    "TokenizerUnavailable",
    "approximate",
    "compact_entries",
    "fit",
    "is_summary",
    "plan_compaction",
    "tiktoken_unavailable",
]
