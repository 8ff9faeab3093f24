"""LangGraph: :func:`add_messages`, the ``add_messages`` reducer with the GR-MEM rules.

A drop-in for ``langgraph.graph.message.add_messages``::

    from typing import Annotated
    from langchain_core.messages import AnyMessage
    from flowmem.integrations.langgraph import add_messages

    class State(TypedDict):
        messages: Annotated[list[AnyMessage], add_messages]

It keeps LangGraph's semantics — dicts, tuples, strings and message objects
are coerced to messages, a message without an id gets a uuid, a message whose
id is already in the state replaces it in place, ``RemoveMessage(id)``
deletes (an unknown id raises ``ValueError``), ``RemoveMessage(id=
REMOVE_ALL_MESSAGES)`` drops everything before it, and ``format=
"langchain-openai"`` formats the result — and the messages that are new to
the state are appended by tool call id with the buffer rules of
:mod:`flowmem.plan` (the one place they are decided):

- MEM-1: a ``ToolMessage`` for a call that already has a result is dropped;
- MEM-2: an ``AIMessage`` whose every tool call id is already declared is dropped —
  under the default ``call_ids="per_turn"`` (:mod:`flowmem.call_ids`) a new message
  re-declaring an answered id is a new call (LangGraph's messages carry their own
  ids, and scripted and local models reuse call ids); ``call_ids="strict"`` is the
  spec's reading;
- MEM-3: before a ``HumanMessage``, every unanswered call gets an interrupted
  ``ToolMessage`` (``status="error"``, ``additional_kwargs={"healed": True}``)
  right after its turn's block of results;
- MEM-10: a real result for a healed call replaces its placeholder in place.

Cost: LangGraph's own reducer copies the state and indexes all its ids on
every update. This one keeps the ids and pairing indexes of the states it
returned (the last 64) and grows them by what each update appends, so past
a copy of the state an update costs what it adds; they are derived again
(one pass, as LangGraph's) only after a heal inside the state, a
replacement or a removal, or for a state it has not seen (restored from a
checkpoint, or reduced a second time). After ``RemoveMessage(id=
REMOVE_ALL_MESSAGES)`` the remaining messages are merged into an empty
state, so the same rules apply to them.

Requires ``pip install 'flowmem[langgraph]'``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from functools import partial
from typing import Annotated, Any, Final

from typing_extensions import TypedDict

from ..errors import MissingDependency

try:
    from langchain_core.messages import (
        AnyMessage,
        BaseMessage,
        BaseMessageChunk,
        RemoveMessage,
        ToolMessage,
        convert_to_messages,
        convert_to_openai_messages,
        message_chunk_to_message,
    )
    from langgraph.graph.message import REMOVE_ALL_MESSAGES
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency("langgraph", "langgraph") from exc

from ..call_ids import CallIds, PerTurn, caller_id, check_call_ids
from ..ids import is_healed
from ..messages import Message, healed_placeholder
from ..plan import (
    AddEntry,
    BufferView,
    HealTurn,
    NewTurn,
    ReplacePlaceholder,
    mentioned_ids,
    needs_pending,
    plan_append,
    stored_ids,
)
from ._langgraph_index import Index, pairing, remember, role_only, take
from .langchain import from_entry

__all__ = ["REMOVE_ALL_MESSAGES", "MessagesState", "add_messages"]

_FORMATS: Final = ("langchain-openai",)


def add_messages(left: Any = None, right: Any = None, *,
                 format: str | None = None, call_ids: CallIds = "per_turn") -> Any:
    """Merge ``right`` into ``left`` as LangGraph does, with the GR-MEM rules (module doc).

    Called with options only (``add_messages(format="langchain-openai")``,
    ``add_messages(call_ids="strict")``) it returns the reducer with them, as
    LangGraph's does. ``call_ids``: the call-id policy, ``"per_turn"`` by default
    (module doc).
    """
    per_turn = check_call_ids(call_ids) == "per_turn"
    if left is None and right is None:
        reducer: Callable[..., Any] = partial(_merge, format=format, per_turn=per_turn)
        return reducer
    if left is None or right is None:
        raise ValueError("Must specify non-null arguments for both 'left' and 'right'. "
                         f"Only received: '{'left' if left is not None else 'right'}'.")
    return _merge(left, right, format=format, per_turn=per_turn)


class MessagesState(TypedDict):
    """A drop-in for ``langgraph.graph.MessagesState`` with flowmem's reducer."""

    messages: Annotated[list[AnyMessage], add_messages]


def _coerce(messages: Any) -> list[BaseMessage]:
    items = messages if isinstance(messages, list) else [messages]
    if all(issubclass(t, BaseMessage) and not issubclass(t, BaseMessageChunk)
           for t in set(map(type, items))):
        return items
    return [message_chunk_to_message(m) if isinstance(m, BaseMessageChunk) else m
            for m in convert_to_messages(items)]


def _merge(left: Any, right: Any, *, format: str | None = None,
           per_turn: bool = True) -> list[BaseMessage]:
    if format is not None and format not in _FORMATS:
        raise ValueError(f"Unrecognized {format=}. Expected one of 'langchain-openai', None.")
    state, incoming = _coerce(left), _coerce(right)
    known = take(state, per_turn)
    if known is None:  # a state this reducer returned has every id already
        for message in state:
            if message.id is None:
                message.id = str(uuid.uuid4())
    cut = None
    for index, message in enumerate(incoming):
        if message.id is None:
            message.id = str(uuid.uuid4())
        if isinstance(message, RemoveMessage) and message.id == REMOVE_ALL_MESSAGES:
            cut = index
    if cut is not None:
        state, incoming, known = [], incoming[cut + 1:], None
    merged, new, changed = _by_id(state, incoming, None if known is None else known.ids)
    if changed:
        known = None
    merged = _with_rules(merged, new, known, per_turn)
    if format == "langchain-openai":
        merged = convert_to_messages(convert_to_openai_messages(merged))
    return merged


def _by_id(state: list[BaseMessage], incoming: list[BaseMessage],
           at: dict[str | None, int] | None = None,
           ) -> tuple[list[BaseMessage], list[BaseMessage], bool]:
    """LangGraph's id semantics: replacements and removals.

    ``at`` maps the state's ids to their positions (kept from a previous
    update, or derived here). Returns the state after them, the messages new
    to it, and whether the state itself changed.
    """
    merged = state.copy()
    if at is None:
        at = {m.id: i for i, m in enumerate(merged)}
    new: dict[str | None, BaseMessage] = {}
    removed: set[str | None] = set()
    changed = False
    for message in incoming:
        known = at.get(message.id)
        if known is not None or message.id in new:
            if isinstance(message, RemoveMessage):
                removed.add(message.id)
                continue
            removed.discard(message.id)
            if known is not None:
                changed = True
                merged[known] = message
            else:
                new[message.id] = message
        elif isinstance(message, RemoveMessage):
            raise ValueError("Attempting to delete a message with an ID that doesn't exist "
                             f"('{message.id}')")
        else:
            new[message.id] = message
    if removed:
        changed = changed or any(m.id in removed for m in merged)
        merged = [m for m in merged if m.id not in removed]
    return merged, [m for key, m in new.items() if key not in removed], changed


def _placeholder(call_id: str) -> BaseMessage:
    message = from_entry(healed_placeholder(caller_id(call_id)))
    message.id = str(uuid.uuid4())
    return message


def _with_rules(merged: list[BaseMessage], new: list[BaseMessage],
                known: Index | None, per_turn: bool = False) -> list[BaseMessage]:
    """Append ``new`` to ``merged`` as :func:`flowmem.plan.plan_append` decides (under the
    ``per_turn`` policy, on the stored ids :func:`flowmem.call_ids.assign` gives)."""
    indexes = known if known is not None else Index(merged, per_turn)
    if not new:
        return remember(indexes if known is None else known.grown(merged, len(merged)))
    views = [pairing(m, per_turn) or role_only(m) for m in new]
    batch: list[Message] = PerTurn(views) if per_turn else views
    mentioned = mentioned_ids(batch)
    view = BufferView(
        results={call: is_healed(pairing(merged[indexes.results[call][0]]) or {})
                 for call in mentioned if call in indexes.results},
        declared={call for call in mentioned if call in indexes.calls},
        pending=list(indexes.pending.values()) if needs_pending(batch) else ())
    if per_turn:  # the stored ids first, then the rules on them (no store keeps them here)
        view, views = stored_ids(indexes.facts(view, batch, merged), views)
    source = {id(view): message for view, message in zip(views, new, strict=True)}
    plan = plan_append(view, views)
    stored = len(merged)
    read: dict[int, Message] | None = {} if per_turn else None
    out, inside = _apply(merged, plan.ops, source, indexes.results, read)
    if inside:
        kept = None if read is None else {**(indexes.read or {}), **read}
        return remember(Index(out, per_turn, kept and {id(m): kept[id(m)] for m in out
                                                         if id(m) in kept}))
    return remember(indexes.grown(out, stored, read))


def _apply(merged: list[BaseMessage], ops: Any, source: dict[int, BaseMessage],
           results: dict[str, list[int]], read: dict[int, Message] | None = None,
           ) -> tuple[list[BaseMessage], bool]:
    """The state after the plan's operations, and whether it changed inside ``merged``
    (``read`` receives what the rules read of each message added, by object)."""
    after: dict[int, list[BaseMessage]] = {}  # placeholders after a stored index
    tail: list[BaseMessage] = []
    added: dict[int, BaseMessage] = {}
    healed_here: dict[str, tuple[list[BaseMessage], BaseMessage]] = {}
    for op in ops:
        if isinstance(op, AddEntry):
            added[op.ordinal] = source[id(op.message)]
            tail.append(added[op.ordinal])
            if read is not None:
                read[id(added[op.ordinal])] = op.message
        elif isinstance(op, ReplacePlaceholder):
            real = source[id(op.message)]
            if op.call_id in healed_here:
                holder, placeholder = healed_here.pop(op.call_id)
                holder[next(i for i, m in enumerate(holder) if m is placeholder)] = real
            else:
                merged[results[op.call_id][0]] = real
            if read is not None:
                read[id(real)] = op.message
        elif isinstance(op, HealTurn):
            placeholders = [_placeholder(call) for call in op.call_ids]
            if read is not None:
                read.update((id(p), healed_placeholder(c))
                            for p, c in zip(placeholders, op.call_ids, strict=True))
            if isinstance(op.turn, NewTurn):
                new_turn = added[op.turn.ordinal]
                turn, end = next(i for i, m in enumerate(tail) if m is new_turn), None
            else:  # a stored turn whose block reaches the end goes on in the added messages
                turn, end = -1, _block_end(merged, op.turn)
            if end is None or end == len(merged):
                spot = _block_end(tail, turn)
                tail[spot:spot] = placeholders
                holder = tail
            else:
                holder = after.setdefault(end - 1, [])
                holder.extend(placeholders)
            for call, placeholder in zip(op.call_ids, placeholders, strict=True):
                healed_here[call] = (holder, placeholder)
    if not after:
        merged.extend(tail)  # ``merged`` is this update's own copy of the state
        return merged, False
    out: list[BaseMessage] = []
    for index, message in enumerate(merged):
        out.append(message)
        out.extend(after.get(index, ()))
    out.extend(tail)
    return out, True


def _block_end(messages: list[BaseMessage], turn: int) -> int:
    """The index right after ``turn``'s contiguous block of tool results."""
    spot = turn + 1
    while spot < len(messages) and isinstance(messages[spot], ToolMessage):
        spot += 1
    return spot

