"""Token budgets on read: the newest whole turns that fit (pure, no I/O).

The rules, decided here once for :meth:`flowmem.Memory.history`,
:class:`flowmem.AsyncMemory`, the HTTP doors, the CLI and the
``flowmem.formats.to_*`` renderers:

- **Units.** The kept part is a run of whole turns, each a ``user`` message
  and everything up to the next one (assistant steps, their tool results —
  real or healed — and any re-fired or late result). A turn is kept or left
  out whole, so an assistant turn and its results always go together.
- **Start.** The kept part starts on a ``user`` message, or on the
  conversation's first message after its leading system messages.
- **Pairing.** A tool result whose call is not in the kept part (a late
  result whose call was left out, an orphan) is left out with it; what stays
  is repaired as MEM-5 repairs it (a call still waiting for its result gets
  the interrupted placeholder, a displaced result moves into its block), so
  the output is sendable.
- **System.** The leading system messages (a compaction summary among them)
  are kept and counted unless ``keep_system=False``. When they alone exceed
  the budget, nothing is kept.
- **Count.** ``tokens`` is the counter applied to exactly the output, in the
  dialect it will be sent in; the output is the longest run of turns whose
  count is within ``max_tokens`` (the next older turn would exceed it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidInput
from ..ids import call_entries, call_id, declared_call_ids, result_id
from ..messages import Message, coerce_content
from ..normalize import repair_pairing
from ._counters import TokenCounter, additive, approximate

__all__ = ["Fitted", "Fitter", "check_budget", "clean", "countable", "fit", "render_for"]

Entry = tuple[int, Message]
"""A stored message with its position."""


def check_budget(max_tokens: Any, counter: Any, format: Any) -> tuple[int, TokenCounter, str]:
    """Validated ``(max_tokens, counter, format)`` (the default counter when ``None``)."""
    from ..formats import check_format

    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise InvalidInput(f"max_tokens must be a non-negative integer, got {max_tokens!r}")
    if counter is None:
        counter = approximate
    elif not callable(counter):
        raise InvalidInput(f"counter must be a callable (messages -> int), got {counter!r}")
    return max_tokens, counter, check_format(format)


def render_for(messages: list[Message], format: str) -> Any:
    """``messages`` as they will be sent in ``format`` (``canonical``: repaired, MEM-5)."""
    if format == "canonical":
        return repair_pairing(messages)[0]
    from ..formats import render

    return render(messages, format).output


def countable(output: Any, format: str) -> list[Any]:
    """What a counter is given for ``output``: an Anthropic payload's ``system`` becomes
    one leading ``{"role": "system", "content": ...}``; other dialects are lists already."""
    if format != "anthropic":
        return list(output)
    system = output.get("system")
    lead = [] if system is None else [{"role": "system", "content": system}]
    return [*lead, *output["messages"]]


@dataclass
class Fitted:
    """What fits: ``output`` in the dialect, ``messages`` (canonical, repaired) with
    ``positions`` (a stored message's position, ``-1`` for a placeholder the repair
    synthesized), ``tokens`` (the counter on ``output``), ``omitted`` (stored messages
    left out), ``kept`` (stored messages kept)."""

    output: Any
    messages: list[Message]
    positions: list[int]
    tokens: int
    omitted: int = 0
    kept: int = 0
    first_body: int | None = field(default=None, repr=False)


def _paired(body: Sequence[Entry]) -> list[Entry]:
    """``body`` without the tool results whose call it does not declare."""
    declared = {call for _, message in body if message["role"] == "assistant"
                for call in declared_call_ids(message)}
    return [(pos, message) for pos, message in body
            if message["role"] != "tool" or result_id(message) in declared]


def clean(messages: Sequence[Entry]) -> bool:
    """Whether MEM-5's repair leaves ``messages`` (a run starting on a ``user`` turn, no
    system message kept before it) exactly as they are: no system message among them,
    each call id declared once and answered once in its own block (right after the
    assistant turn), no call left waiting, no empty assistant turn. Such a run stays so
    when whole turns are cut from its start, so each of its cuts is its own output."""
    waiting: set[str] = set()
    declared: set[str] = set()
    for _, message in messages:
        role = message["role"]
        if role == "tool":
            found = result_id(message)
            if found is None or found not in waiting:
                return False
            waiting.discard(found)
            continue
        if waiting or role == "system":
            return False
        if role == "assistant":
            calls = call_entries(message)
            for call in calls:
                found = call_id(call)
                if found is None or found in declared:
                    return False
                declared.add(found)
                waiting.add(found)
            if not calls and coerce_content(message.get("content")) == "":
                return False
    return not waiting


class Fitter:
    """The budget decision over a conversation's tail, read a page at a time.

    :meth:`choose` is given the leading system messages (``head``), the newest
    messages read so far (``body``, oldest first, none of the head) and
    whether ``body`` reaches back to the head (``complete``); it answers the
    :class:`Fitted` result, or ``None`` when it needs older messages. Each
    turn's count is kept, so reading more costs only the new turns.
    """

    def __init__(self, max_tokens: int, counter: TokenCounter, format: str,
                 keep_system: bool = True) -> None:
        self.max_tokens = max_tokens
        self.counter = counter
        self.format = format
        self.keep_system = keep_system
        self._turns: dict[tuple[int, int | None], int] = {}
        self.per_message = 0.0
        """Tokens per message of the turns counted when :meth:`choose` last asked for more."""
        # canonical output counted by a built-in counter: a message at a time, each once
        self._additive = additive(counter) if format == "canonical" else None
        self._costs: dict[int, tuple[Message, int]] = {}

    def count(self, messages: list[Message]) -> tuple[Any, int]:
        output = render_for(messages, self.format)
        return output, int(self.counter(countable(output, self.format)))

    def _turn(self, body: Sequence[Entry], start: int, end: int) -> int:
        key = (body[start][0], body[end][0] if end < len(body) else None)
        cost = self._turns.get(key)
        if cost is None:
            # an estimate: the stored messages counted as they are (no rendering); the
            # exact count of the output corrects it (choose's last two loops)
            cost = self._turns[key] = int(self.counter([m for _, m in body[start:end]]))
        return cost

    def _exact(self, head: Sequence[Entry], body: Sequence[Entry], cut: int | None) -> Fitted:
        kept = ([*head] if self.keep_system else []) + (
            _paired(body[cut:]) if cut is not None else [])
        messages = [m for _, m in kept]
        output, tokens = self.count(messages)
        where = {id(m): pos for pos, m in kept}
        repaired = output if self.format == "canonical" else repair_pairing(messages)[0]
        return Fitted(output, repaired, [where.get(id(m), -1) for m in repaired], tokens,
                      kept=len(kept), first_body=None if cut is None else body[cut][0])

    def _cost(self, entry: Entry) -> int:
        """One stored message's tokens, counted once per read (a page read again holds
        equal messages at the same positions)."""
        known = self._costs.get(entry[0])
        if known is None or (known[0] is not entry[1] and known[0] != entry[1]):
            assert self._additive is not None
            known = self._costs[entry[0]] = (entry[1], self._additive.message_tokens(entry[1]))
        return known[1]

    def _summed(self, head: Sequence[Entry], body: Sequence[Entry],
                cuts: list[int], complete: bool) -> Fitted | None:
        """:meth:`choose` for canonical output and an additive counter: when the kept turns
        and the next older one are a clean run, the output is the stored messages
        themselves, so each count is exact as summed; otherwise :meth:`_rendered`."""
        assert self._additive is not None
        request = self._additive.per_request
        kept = list(head) if self.keep_system else []
        total = fixed = sum(self._cost(entry) for entry in kept)
        if kept and total + request > self.max_tokens:  # the system messages alone
            return Fitted([], [], [], 0)
        best, end = len(cuts), len(body)
        for k in range(len(cuts) - 1, -1, -1):
            turn = sum(self._cost(entry) for entry in body[cuts[k]:end])
            if total + turn + request > self.max_tokens:
                break
            total, best, end = total + turn, k, cuts[k]
        else:
            if not complete:
                covered = len(body) - (cuts[0] if cuts else len(body))
                self.per_message = (total - fixed) / max(1, covered)
                return None
        if cuts and not clean(body[cuts[max(best - 1, 0)]:]):
            return self._rendered(head, body, cuts, complete)  # the repair would change it
        if best < len(cuts):
            kept += body[cuts[best]:]
        messages = [m for _, m in kept]
        return Fitted(messages, list(messages), [p for p, _ in kept],
                      total + request if kept else 0, kept=len(kept),
                      first_body=body[cuts[best]][0] if best < len(cuts) else None)

    def choose(self, head: Sequence[Entry], body: Sequence[Entry],
               complete: bool) -> Fitted | None:
        cuts = [i for i, (_, m) in enumerate(body) if m["role"] == "user"]
        if complete and body and (not cuts or cuts[0] != 0):
            cuts.insert(0, 0)  # the conversation's first message after its system prompt
        if not cuts and not complete:
            return None
        if self._additive is not None:
            return self._summed(head, body, cuts, complete)
        return self._rendered(head, body, cuts, complete)

    def _rendered(self, head: Sequence[Entry], body: Sequence[Entry], cuts: list[int],
                  complete: bool) -> Fitted | None:
        """:meth:`choose` by estimates per turn, corrected by counting the rendered output."""
        head_cost = self.count([m for _, m in head])[1] if head and self.keep_system else 0
        total, best = head_cost, len(cuts)  # best == len(cuts): no turn kept
        for k in range(len(cuts) - 1, -1, -1):
            total += self._turn(body, cuts[k], cuts[k + 1] if k + 1 < len(cuts) else len(body))
            if total > self.max_tokens:
                break
            best = k
        else:
            if not complete:
                covered = len(body) - (cuts[0] if cuts else len(body))
                self.per_message = (total - head_cost) / max(1, covered)
                return None
        fitted = self._exact(head, body, cuts[best] if best < len(cuts) else None)
        while fitted.tokens > self.max_tokens:
            if best >= len(cuts):  # the system messages alone are over the budget
                return Fitted(render_for([], self.format), [], [], 0)
            best += 1
            fitted = self._exact(head, body, cuts[best] if best < len(cuts) else None)
        while best > 0:  # the estimate summed turns apart: the exact count may fit more
            trial = self._exact(head, body, cuts[best - 1])
            if trial.tokens > self.max_tokens:
                return fitted
            best, fitted = best - 1, trial
        return fitted if complete else None  # the oldest turn read fits: read older ones


def leading_system(messages: Sequence[Entry]) -> int:
    """How many of ``messages`` are the leading system run."""
    count = 0
    for _, message in messages:
        if message["role"] != "system":
            break
        count += 1
    return count


def fit(history: Sequence[Message], max_tokens: int, *, counter: TokenCounter | None = None,
        format: str = "canonical", keep_system: bool = True) -> Fitted:
    """The newest whole turns of ``history`` (stored, canonical) within ``max_tokens``.

    ``output`` is ready for the provider of ``format``; ``positions`` are indexes
    into ``history``. See the module's rules.
    """
    budget, checked, dialect = check_budget(max_tokens, counter, format)
    from ..messages import canonical_messages

    entries = list(enumerate(canonical_messages(list(history), where="history")))
    split = leading_system(entries)
    fitted = Fitter(budget, checked, dialect, keep_system).choose(
        entries[:split], entries[split:], True)
    assert fitted is not None  # complete: never asks for more
    fitted.omitted = len(entries) - fitted.kept
    return fitted
