"""Conversations and values in and out of a store as JSON Lines, streaming.

One JSON object per line (the format is documented in ``docs/cli.md``)::

    {"kind": "message", "scope": "user", "scope_id": "alice", "key": "chat", "message": {...}}
    {"kind": "value", "scope": "user", "scope_id": "alice", "key": "prefs", "value": ...}

A conversation's ``message`` lines come oldest first, each message in the
canonical shape :meth:`Memory.history` returns. :func:`export_lines` reads a
conversation in pages of :data:`PAGE` with ``Memory.history``'s ``before``
cursor, so memory stays bounded by one page (plus one integer per page) at
any length; :func:`import_lines` appends in batches through
:meth:`Memory.append`, so every rule (MEM-1..14) applies on the way in, and
re-importing an export into a fresh store gives the same message histories —
with one exception the rules themselves make: a window (``max_messages``)
that evicted an orphan result can leave a call unanswered before a later
user turn, and replaying that through append heals the call (MEM-3).
Positions are the store's: an import renumbers them.

Both are layers over :class:`~flowmem.Memory` (no rule is decided here).

An import is idempotent per batch: each ``Memory.append`` carries an
idempotency key derived from the batch itself (its conversation, the ordinal
of its first message in that conversation, its messages), so running the same
file again with the same ``batch`` — after an interruption, within the
idempotency records' lifetime (24 h by default) — replays the batches
already stored and stores each message exactly once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from .errors import InvalidInput, KeyConflict, ScopeRefused
from .memory import Memory
from .messages import Message, canonical_message, json_copy
from .scopes import SCOPES, ExecutionContext, check_key, resolve_scope

__all__ = [
    "BATCH",
    "PAGE",
    "ImportSummary",
    "context_for",
    "export_key",
    "export_lines",
    "import_lines",
    "parse_line",
    "scope_keys",
]

PAGE: Final = 1000
"""Messages read per ``Memory.history`` call."""
BATCH: Final = 1000
"""Messages appended per ``Memory.append`` call on import."""

Progress = Callable[[int], None]
"""Called with how many more messages were just read or written."""


def context_for(scope: str, scope_id: str) -> ExecutionContext:
    """A context under which ``scope`` resolves to ``scope_id``.

    Every id field carries ``scope_id``, so the scope's own field (whichever
    :func:`~flowmem.resolve_scope` reads) names it; nothing else is decided here.
    """
    return ExecutionContext(user_id=scope_id, session_id=scope_id, workflow_id=scope_id,
                            pipeline_id=scope_id, execution_id=scope_id)


# TEMPORARY (integrator): Memory has no method listing keys yet, so this one helper
# reaches into memory.store.keys, as the server does. Replace it with the coordinator
# method when it exists; nothing else here touches the store.
def scope_keys(memory: Memory, scope: str,
               context: ExecutionContext) -> tuple[str, Iterator[str]]:
    """``(scope id, its keys in order, read page by page)``.

    Raises :class:`ScopeRefused` (MEM-6, MEM-13) before anything is read.
    """
    scope_id = resolve_scope(scope, context)

    def pages() -> Iterator[str]:
        after: str | None = None
        while True:
            page = memory.keys(scope, context=context, after=after, limit=PAGE)
            yield from page
            if len(page) < PAGE:
                return
            after = page[-1]

    return scope_id, pages()


@dataclass
class _Walk:
    """A conversation walked newest to oldest: where each page starts, and its extent."""

    scope_id: str
    refused: bool
    starts: list[int]
    """Each page's first position, descending."""
    top: int | None
    """One past the newest position when walked (``None``: no messages)."""
    count: int


def _walk(memory: Memory, scope: str, key: str, context: ExecutionContext) -> _Walk:
    walk: _Walk | None = None
    cursor: int | None = None
    while True:
        page = memory.history(scope, key, context=context, last=PAGE, before=cursor)
        if walk is None:
            walk = _Walk(page.resolved_scope_id, page.refused, [],
                         page.positions[-1] + 1 if page.positions else None, 0)
        if not page.positions:
            return walk
        walk.starts.append(page.positions[0])
        walk.count += len(page.positions)
        if page.before is None:
            return walk
        cursor = page.before


def _range(memory: Memory, scope: str, key: str, context: ExecutionContext,
           low: int, high: int) -> list[Message]:
    """The messages at positions in ``[low, high)``, oldest first (a page or a little more)."""
    chunks: list[list[Message]] = []
    cursor = high
    while True:
        page = memory.history(scope, key, context=context, last=PAGE, before=cursor)
        kept = [m for p, m in zip(page.positions, page.messages, strict=True) if p >= low]
        chunks.append(kept)
        if page.before is None or not page.positions or page.positions[0] <= low:
            break
        cursor = page.positions[0]
    return [message for chunk in reversed(chunks) for message in chunk]


def _messages(memory: Memory, scope: str, key: str, context: ExecutionContext,
              walk: _Walk) -> Iterator[Message]:
    assert walk.top is not None
    highs = [walk.top, *walk.starts[:-1]]
    for low, high in zip(reversed(walk.starts), reversed(highs), strict=True):
        yield from _range(memory, scope, key, context, low, high)


def export_key(memory: Memory, scope: str, key: str, context: ExecutionContext,
               progress: Progress | None = None) -> Iterator[dict[str, Any]]:
    """The lines of one key: its messages oldest first, or its value, or nothing.

    A snapshot of the conversation as it was when the export reached it:
    messages appended later are not included. Yields nothing under a
    refused scope, for a missing key and for an empty conversation. (Through
    ``Memory`` the SQL stores cannot tell an empty conversation from the
    plain value ``[]``; both export as nothing.)
    """
    try:
        walk: _Walk | None = _walk(memory, scope, key, context)
    except KeyConflict:  # the stores that say so: the key holds a plain value
        walk = None
    if walk is not None and (walk.refused or walk.top is not None):
        head = {"scope": scope, "scope_id": walk.scope_id, "key": key}
        if walk.top is not None:
            for message in _messages(memory, scope, key, context, walk):
                yield {"kind": "message", **head, "message": message}
                if progress is not None:
                    progress(1)
        return
    found = memory.read(scope, key, context=context)
    if found.found and (walk is None or found.value != []):
        yield {"kind": "value", "scope": scope, "scope_id": found.resolved_scope_id,
               "key": key, "value": found.value}


def export_lines(memory: Memory, scope: str, keys: Iterable[str], context: ExecutionContext,
                 progress: Progress | None = None) -> Iterator[str]:
    """JSON Lines (without newlines) for ``keys``, in the order given."""
    for key in keys:
        for line in export_key(memory, scope, key, context, progress):
            yield json.dumps(line, ensure_ascii=False, separators=(",", ":"))


def parse_line(text: str, number: int) -> dict[str, Any]:
    """Validate one line; raise :class:`InvalidInput` naming the line number."""
    try:
        line = json.loads(text)
    except RecursionError:
        raise InvalidInput(f"line {number}: nested too deep") from None
    except ValueError as exc:
        raise InvalidInput(f"line {number}: not JSON ({exc})") from None
    if not isinstance(line, dict):
        raise InvalidInput(f"line {number}: expected a JSON object")
    kind = line.get("kind")
    if kind not in ("message", "value"):
        raise InvalidInput(f"line {number}: kind must be 'message' or 'value', got {kind!r}")
    if line.get("scope") not in SCOPES:
        raise InvalidInput(f"line {number}: scope must be one of {', '.join(SCOPES)}, "
                           f"got {line.get('scope')!r}")
    for name in ("scope_id", "key"):
        if not isinstance(line.get(name), str):
            raise InvalidInput(f"line {number}: {name} must be a string")
    try:  # the same bounds Memory checks, before any write
        check_key(line["key"])
    except InvalidInput as exc:
        raise InvalidInput(f"line {number}: {exc}") from None
    try:
        resolve_scope(line["scope"], context_for(line["scope"], line["scope_id"]))
        if kind == "message":
            line["message"] = canonical_message(line.get("message"),
                                                where=f"line {number}: message")
        elif "value" not in line:
            raise InvalidInput(f"line {number}: a value line needs 'value'")
        else:
            line["value"] = json_copy(line["value"], what=f"line {number}: value")
    except ScopeRefused as refusal:
        raise InvalidInput(f"line {number}: {refusal}") from None
    except RecursionError:
        raise InvalidInput(f"line {number}: nested too deep") from None
    return line


@dataclass
class ImportSummary:
    """What an import did: lines read, messages appended (MEM-14), values written."""

    lines: int = 0
    messages: int = 0
    appended: int = 0
    values: int = 0
    conversations: int = 0
    replayed: int = 0
    """Messages of batches an earlier (interrupted) run had already stored: not stored again."""


def batch_key(where: tuple[str, str, str], first: int, messages: list[Message]) -> str:
    """The idempotency key of one import batch: its conversation, the ordinal of its first
    message in the file's conversation, and its messages (the same batch, the same key)."""
    digest = hashlib.sha256(json.dumps([*where, first, messages], ensure_ascii=True,
                                       sort_keys=True, separators=(",", ":")).encode())
    return f"import:{digest.hexdigest()[:40]}"


def import_lines(memory: Memory, lines: Iterable[str], *, batch: int = BATCH,
                 progress: Progress | None = None) -> ImportSummary:
    """Append every ``message`` line and write every ``value`` line, in order.

    Consecutive messages of one conversation go in batches of ``batch`` per
    :meth:`Memory.append`. Blank lines are skipped. Raises
    :class:`InvalidInput` on the first bad line (validate first with
    :func:`parse_line` to change nothing on bad input, as the CLI does).
    """
    summary = ImportSummary()
    pending: list[Message] = []
    target: tuple[str, str, str] | None = None
    seen: dict[tuple[str, str, str], int] = {}  # conversation -> messages read so far

    def flush() -> None:
        if target is None or not pending:
            return
        scope, scope_id, key = target
        first = seen[target] - len(pending)
        result = memory.append(scope, key, pending, context=context_for(scope, scope_id),
                               idempotency_key=batch_key(target, first, pending))
        summary.messages += len(pending)
        if result.replayed:  # stored by an earlier run: its figures are that run's
            summary.replayed += len(pending)
        else:
            summary.appended += result.appended
        if progress is not None:
            progress(len(pending))
        pending.clear()

    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        line = parse_line(text, number)
        summary.lines += 1
        where = (line["scope"], line["scope_id"], line["key"])
        if where != target or len(pending) >= batch:
            flush()
            target = where
        if line["kind"] == "value":
            memory.write(where[0], where[2], line["value"], context=context_for(*where[:2]))
            summary.values += 1
            target = None
            continue
        if where not in seen:
            seen[where] = 0
            summary.conversations += 1
        seen[where] += 1
        pending.append(line["message"])
    flush()
    return summary
