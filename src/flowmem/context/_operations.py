"""The budgeted read and the compaction's read as operations of either face.

Each is a generator in the coordinator's style (:mod:`flowmem.coordinator`): it
validates, resolves the scope through the core (the ONE place a refusal is acted
on, MEM-7), yields the store calls of :mod:`._read` and builds the result, so
:class:`~flowmem.Memory` and :class:`~flowmem.AsyncMemory` run the same code.
"""

from __future__ import annotations

from typing import Any

from ..coordinator import MemoryCore, Operation
from ..errors import InvalidInput
from ..results import HistoryResult
from ..scopes import ExecutionContext, StorageKey, check_cursor
from ._budget import check_budget
from ._compact import CompactResult
from ._read import budgeted_history, compaction_plan

__all__ = ["budgeted", "compaction"]


def budgeted(core: MemoryCore, scope: str, key: str, context: ExecutionContext | None,
             max_tokens: int, counter: Any, format: str,
             keep_system: bool) -> Operation[HistoryResult]:
    """``history(max_tokens=…)``: the newest whole turns within the budget."""
    budget, checked, dialect = check_budget(max_tokens, counter, format)
    where = core._locate("history", scope, key, context)
    if where is None:
        return HistoryResult(scope=scope, refused=True, total=0, tokens=0, omitted=0)
    result: HistoryResult = yield from budgeted_history(where, budget, checked, dialect,
                                                         bool(keep_system))
    return core._callers(result)


def compaction(core: MemoryCore, scope: str, key: str, context: ExecutionContext | None,
               keep_last: int | None, keep_last_tokens: int | None, counter: Any,
               format: str, idempotency_key: str | None) -> Operation[Any]:
    """A compaction's read: its plan, or its final result (refused, replayed, nothing)."""
    if (keep_last is None) == (keep_last_tokens is None):
        raise InvalidInput("give exactly one of keep_last and keep_last_tokens")
    if keep_last is not None:
        check_cursor("keep_last", keep_last, low=0)
    _, checked, dialect = check_budget(keep_last_tokens or 0, counter, format)
    if keep_last_tokens is not None:
        check_budget(keep_last_tokens, counter, format)
    if idempotency_key is not None:  # validated as every idempotency key is
        core._idempotency(idempotency_key, "compact", StorageKey(scope, "", "k"), None)
    where = core._locate("compact", scope, key, context)
    if where is None:
        return CompactResult(scope, "", refused=True)
    plan = yield from compaction_plan(where, keep_last, keep_last_tokens, checked, dialect,
                                      idempotency_key)
    return plan
