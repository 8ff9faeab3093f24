"""The store calls of a budgeted read and of a compaction (sans-I/O generators).

Written once, for both faces, as :mod:`flowmem.coordinator` writes every
operation: each function yields :class:`~flowmem.store.StoreCall`\\s
and receives the answers. A budgeted read pages BACKWARDS from the newest
message (``history(last=, before=)``) until the budget is decided, and finds
the leading system messages with a few more page reads positioned by the
stored positions and the pages' ``total`` (interpolated, then halved): what
it reads is what it returns plus at most one page, whatever the
conversation's length.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Final

from ..messages import Message
from ..results import HistoryResult
from ..scopes import StorageKey
from ..store import StoreCall
from ._budget import Entry, Fitter, leading_system
from ._compact import (
    CompactionConflict,
    CompactionPlan,
    CompactResult,
    plan_compaction,
    replayed,
    summary_message,
)
from ._counters import TokenCounter

__all__ = ["budgeted_history", "compaction_plan", "compaction_write"]

Op = Generator[StoreCall, Any, Any]
FIRST_PAGE: Final = 32
HEAD_PAGE: Final = 8
_LOWEST: Final = -(2 ** 62)


def _entries(page: Any) -> list[Entry]:
    return list(zip(page.positions, page.messages, strict=True))


def _head(where: StorageKey, newest: Any) -> Op:
    """``(head entries, position of the first non-system message or None)``.

    ``newest`` is a page that does not reach the start (its ``before`` is set).
    Looks for a cursor ``x`` with between ``low`` and ``size`` entries older
    than it, at least one of them not a system message: that page is the
    conversation's start. Positions are interpolated from what pages show;
    past a few tries the bracket is halved.
    """
    positions = newest.positions
    if newest.total is None:  # a store that does not count: read what is older
        older = yield StoreCall("history", (where,), {"before": positions[0]})
        run = _entries(older)
        split = leading_system(run)
        return run[:split], run[split][0] if split < len(run) else positions[0]
    spacing = max(1.0, (positions[-1] - positions[0]) / max(1, len(positions) - 1))
    hi, hi_count = positions[0], newest.total - len(positions)
    lo: int | None = None
    low, size = 1, HEAD_PAGE
    for attempt in range(256):
        guess = int(hi - spacing * (hi_count - (low + size) / 2))
        if attempt > 4 or not (lo if lo is not None else _LOWEST) < guess < hi:
            guess = (lo + hi) // 2 if lo is not None else hi - max(1, int(
                2 * spacing * max(hi_count, 1)) << min(attempt, 60))
        guess = max(guess, _LOWEST)
        page = yield StoreCall("history", (where,), {"last": size, "before": guess})
        count = page.total if page.total is not None else len(page.positions)
        run = _entries(page)
        split = leading_system(run)
        if low <= count <= size and split < len(run):
            return run[:split], run[split][0]
        if count < low or (count <= size and split == len(run)):
            lo = guess
            if split == len(run) and count >= low:  # all system: look further on
                low, size = count + 1, max(size, 2 * (count + 1))
        else:
            hi, hi_count = page.positions[0], count - len(page.positions)
        if len(page.positions) > 1:
            spacing = max(1.0, (page.positions[-1] - page.positions[0])
                          / (len(page.positions) - 1))
        if lo is not None and hi - lo <= 1:
            break
    whole = yield StoreCall("history", (where,), {"before": positions[0]})
    run = _entries(whole)
    split = leading_system(run)
    return run[:split], run[split][0] if split < len(run) else positions[0]


def budgeted_history(where: StorageKey, max_tokens: int, counter: TokenCounter, format: str,
                     keep_system: bool) -> Op:
    """The newest whole turns within ``max_tokens`` (:mod:`._budget`), as a HistoryResult."""
    fitter = Fitter(max_tokens, counter, format, keep_system)
    size = FIRST_PAGE
    page = yield StoreCall("history", (where,), {"last": size})
    total = page.total
    body = _entries(page)
    head: list[Entry] = []
    start: int | None = None  # the first non-system message's position, once known
    cursor = page.before
    if cursor is not None:
        head, start = yield from _head(where, page)
    while True:
        complete = cursor is None or (start is not None and bool(body) and body[0][0] <= start)
        if cursor is None:
            split = leading_system(body)
            head, body = body[:split], body[split:]
        elif start is not None:
            body = [entry for entry in body if entry[0] >= start]
        fitted = fitter.choose(head, body, complete)
        if fitted is not None:
            break
        # read the newest again, enough for the budget by the tokens per message seen:
        # a cursor page (before=) makes SQL stores count what is older, O(length)
        wanted = int(1.25 * max_tokens / max(fitter.per_message, 1.0)) + 8
        size = max(size * 2, min(wanted, size * 16))
        page = yield StoreCall("history", (where,), {"last": size})
        body = _entries(page)
        cursor = page.before
    stored = total if total is not None else None
    omitted = None if stored is None else stored - fitted.kept
    older = fitted.first_body if omitted else None
    return HistoryResult(fitted.messages, fitted.positions, older, where.scope, where.scope_id,
                         total=total, tokens=fitted.tokens, omitted=omitted)


def compaction_plan(where: StorageKey, keep_last: int | None, keep_last_tokens: int | None,
                    counter: TokenCounter, format: str,
                    key: str | None) -> Op:
    """Read the conversation and decide: a :class:`CompactionPlan`, or the final result
    (nothing to compact, or replayed under ``key``)."""
    page = yield StoreCall("history", (where,), {})
    entries = _entries(page)
    if key is not None:
        done = replayed([m for _, m in entries], key)
        if done is not None:
            spec = done["metadata"]["compacted"]
            position = next(p for p, m in entries if m is done)
            return CompactResult(where.scope, where.scope_id, int(spec["count"]), position,
                                 len(entries), replayed=True, summary=done)
    plan = plan_compaction(where, entries, keep_last=keep_last,
                           keep_last_tokens=keep_last_tokens, counter=counter, format=format)
    if plan is None:
        return CompactResult(where.scope, where.scope_id, 0, None, len(entries))
    return plan


def compaction_write(plan: CompactionPlan, text: Any, key: str | None) -> Op:
    """Write the summary of ``plan`` (one atomic edit; CompactionConflict if it changed)."""
    summary: Message = summary_message(plan, text, key)
    if not (yield StoreCall("edit", (plan.where, plan.positions[0], summary))):
        raise CompactionConflict("the first message to compact is gone (evicted or edited)")
    after = yield StoreCall("history", (plan.where,), {"last": 0})
    return CompactResult(plan.where.scope, plan.where.scope_id, len(plan.positions),
                         plan.positions[0], after.total, summary=summary)
