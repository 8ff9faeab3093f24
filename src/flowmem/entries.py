"""Pure functions over a buffer's ``(position, message)`` entries.

Every store uses them on its O(length) paths — loading a handed-in buffer and
the administrative edit (MEM-15) — so those decisions, like the append's, are
taken in one place.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .errors import InvalidInput
from .ids import declared_call_ids, result_id
from .messages import Message, canonical_message
from .plan import PendingCall

__all__ = ["Indexes", "derive_indexes", "edit_entries"]


@dataclass(frozen=True, slots=True)
class Indexes:
    """A buffer's indexes, derived from its entries (see :func:`derive_indexes`)."""

    results: dict[str, list[int]]
    calls: dict[str, list[tuple[int, int]]]
    pending: list[PendingCall]


def derive_indexes(entries: Iterable[tuple[int, Message]]) -> Indexes:
    """Derive a buffer's indexes from ``(position, message)`` pairs in order.

    ``results`` maps an id to the positions of its results (one, unless a
    buffer was handed in with duplicates); ``calls``
    an id to its declarations ``(turn position, order)``; ``pending`` lists
    the declared ids without a result, at their first declaration. Stores use
    it after an administrative edit (MEM-15), when loading is O(length) anyway.
    """
    results: dict[str, list[int]] = {}
    calls: dict[str, list[tuple[int, int]]] = {}
    for pos, message in entries:
        answered = result_id(message)
        if answered is not None:
            results.setdefault(answered, []).append(pos)
        for order, call in enumerate(declared_call_ids(message)):
            calls.setdefault(call, []).append((pos, order))
    pending = [PendingCall(call, *min(turns)) for call, turns in calls.items()
               if call not in results]
    return Indexes(results, calls, pending)


def edit_entries(entries: Sequence[tuple[int, Message]], position: int,
                 message: Message | None) -> list[tuple[int, Message]] | None:
    """The administrative edit (MEM-15), decided once for every store.

    Returns the ``(position, message)`` entries after replacing (or, with
    ``None``, deleting) the one at ``position``, or ``None`` when no entry
    stands there. A replacement is validated strictly and refused
    (:class:`~flowmem.errors.InvalidInput`) when it changes the message's role
    — healing places placeholders right after a block of tool messages, and a
    role change would move those blocks under it — or answers an id another
    entry already answers (no edit stores a result twice, MEM-1).

    A ``system`` replacement carrying ``metadata.compacted`` is a compaction
    summary: it replaces the whole range it describes, atomically, or raises
    :class:`~flowmem.context.CompactionConflict` (:func:`flowmem.context.compact_entries`).
    """
    replacement = None if message is None else canonical_message(message, where="message")
    if replacement is not None and "compacted" in replacement["metadata"] \
            and replacement["role"] == "system":
        from .context._compact import compact_entries  # a compaction summary: one range

        return compact_entries(entries, position, replacement)
    index = next((i for i, (pos, _) in enumerate(entries) if pos == position), None)
    if index is None:
        return None
    kept = [*entries[:index], *entries[index + 1:]]
    if replacement is None:
        return kept
    role = entries[index][1]["role"]
    if replacement["role"] != role:
        raise InvalidInput(f"an edit keeps the message's role ({role!r}), "
                           f"got {replacement['role']!r}")
    answered = result_id(replacement)
    if answered is not None and any(result_id(body) == answered for _, body in kept):
        raise InvalidInput(f"another entry already answers {answered!r}")
    return [*entries[:index], (position, replacement), *entries[index + 1:]]
