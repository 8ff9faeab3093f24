"""Token budgets at the history doors, and compaction at the administrative tier.

A budgeted read (``max_tokens``, with ``counter`` and ``keep_system``; the
dialect is the door's ``format``) answers in a page's shape, decided here
once for ``POST /v1/memory/history`` and ``GET /v1/sessions/{id}/messages``:

- ``messages``: what :meth:`flowmem.AsyncMemory.history` kept (whole turns,
  repaired: a placeholder the repair added has position ``-1``), ``tokens``
  their count in ``format``, ``omitted`` the stored messages left out;
- ``before`` is ``null``: the answer is one decision, not a page of a
  sequence (the leading system messages are kept while older turns are
  not), so no cursor continues it; page the conversation to read the rest;
- ``pagination``: ``total`` the stored messages, ``limit`` the stored
  messages kept, ``offset`` 0, so ``has_more`` says something was left out.

A counter name whose encoding cannot count here (tiktoken missing, its file
not cached) is a 400 ``invalid_field`` naming why, never a 5xx.
"""

from __future__ import annotations

from typing import Any

from ..context import TiktokenCounter, TokenCounter, TokenizerUnavailable, approximate
from ..results import HistoryResult
from ..scopes import ExecutionContext
from ._deps import ServerState, positioned, rendered
from ._responses import ApiError

__all__ = ["budget_answer", "check_budget_knobs", "counter_for"]

_MADE: dict[str, TokenCounter] = {}


def _refuse(locator: str, code: str, message: str) -> ApiError:
    return ApiError("invalid_field", f"{locator.split('.', 1)[-1]}: {message}",
                    details=[{"code": code, "message": message, "locator": locator}])


def counter_for(name: str, locator: str) -> TokenCounter:
    """The counter a door names: ``approximate`` or a tiktoken encoding available here."""
    if name == "approximate":
        return approximate
    found = _MADE.get(name)
    if found is None:
        try:
            found = _MADE[name] = TiktokenCounter(name)  # refuses with tiktoken_unavailable's
        except TokenizerUnavailable as exc:  # reason: never a download, never a 5xx
            raise _refuse(locator, "counter_unavailable", str(exc)) from None
    return found


def check_budget_knobs(server: ServerState, where: str, max_tokens: int | None,
                       paging: dict[str, Any], knobs: dict[str, Any]) -> None:
    """Refuse (400) a budget over the limit, paging fields beside ``max_tokens``, and
    budget knobs without it. ``paging``/``knobs``: the fields given, by name."""
    if max_tokens is None:
        given = [name for name, value in knobs.items() if value is not None]
        if given:
            raise _refuse(f"{where}.{given[0]}", "needs_max_tokens",
                          f"{given[0]} applies to a budgeted read: give max_tokens too")
        return
    limit = server.settings.limits.max_budget_tokens
    if max_tokens > limit:
        raise _refuse(f"{where}.max_tokens", "less_than_equal",
                      f"at most {limit} tokens per budgeted read")
    given = [name for name, value in paging.items() if value is not None]
    if given:
        raise _refuse(f"{where}.{given[0]}", "conflicting_fields",
                      f"max_tokens reads the newest whole turns: give it without {given[0]}")


async def budget_answer(server: ServerState, scope: str, key: str, context: ExecutionContext,
                        *, max_tokens: int, counter: str | None, format: str,
                        keep_system: bool | None, where: str,
                        ) -> tuple[HistoryResult, dict[str, Any], int, int]:
    """A budgeted read as a door answers it: ``(result, data, total, kept)``; the
    caller adds its own keys to ``data`` and pages it as ``paged(data, total, kept, 0)``."""
    counting = counter_for(counter or "approximate", f"{where}.counter")
    result = await server.memory.history(scope, key, context=context, max_tokens=max_tokens,
                                         counter=counting, format=format,
                                         keep_system=True if keep_system is None
                                         else keep_system)
    kept = sum(1 for position in result.positions if position >= 0)
    total = result.total
    if total is None:  # a store that does not count: count the positions (linear)
        total = len((await server.memory.history(scope, key, context=context)).positions)
    data = {"messages": positioned(result), "before": None, "tokens": result.tokens or 0,
            "omitted": total - kept, **rendered(result, format)}
    return result, data, total, kept
