"""The indexes the LangGraph reducer keeps of the states it returned (:mod:`.langgraph`).

What the rules read of each message, the ids and pairing indexes of a state
(grown by what each update appends, derived again after a heal, a replacement
or a removal), and the cache of the last states' indexes. Requires
``pip install 'flowmem[langgraph]'``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Final

from ..errors import MissingDependency

try:
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        ChatMessage,
        HumanMessage,
        ToolMessage,
    )
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency("langgraph", "langgraph") from exc

from ..call_ids import assign, caller_id
from ..entries import derive_indexes
from ..ids import is_healed
from ..messages import Message
from ..plan import BufferView, per_turn_lookups

__all__ = ["Index", "pairing", "remember", "role_only", "take"]


def pairing(message: BaseMessage, per_turn: bool = False) -> Message | None:
    """What the rules read of a message (ids through :mod:`flowmem.ids`; under the
    ``per_turn`` policy also its message id, which tells a copy), or ``None``."""
    if isinstance(message, ToolMessage):
        view: Message = {"role": "tool", "tool_call_id": message.tool_call_id}
        if message.additional_kwargs.get("healed") is True:
            view["healed"] = True
        return view
    if isinstance(message, AIMessage) and message.tool_calls:
        if per_turn:
            return {"role": "assistant", "tool_calls": message.tool_calls,
                    "metadata": {"id": message.id}}
        return {"role": "assistant", "tool_calls": message.tool_calls}
    return None


def role_only(message: BaseMessage) -> Message:
    """A fresh view per message (the plan's operations are mapped back by identity)."""
    if isinstance(message, HumanMessage) or (isinstance(message, ChatMessage)
                                             and message.role == "user"):
        return {"role": "user"}
    return {"role": "assistant" if isinstance(message, AIMessage) else "system"}


class Index:
    """The ids and pairing indexes of a state this reducer returned (positions in it).

    Derived once by :func:`flowmem.entries.derive_indexes` and then grown by
    the messages each update appends (the index moves to the new state; the
    old state, reduced again, is derived anew), so an update costs what it
    adds; a heal inside the state, a replacement or a removal derives it again.
    Under the ``per_turn`` policy it also keeps what the rules read of each
    message (``read``, by object: its stored ids, :mod:`flowmem.call_ids`), as a
    store keeps them in its rows; a state it has not seen is read in order.
    """

    __slots__ = ("calls", "ids", "length", "newest", "pending", "per_turn", "read", "results",
                 "state")

    def __init__(self, state: list[BaseMessage], per_turn: bool = False,
                 read: dict[int, Message] | None = None) -> None:
        self.per_turn = per_turn
        if per_turn and read is None:
            read = _read_in_order(state)
        self.read = read
        found = _derive(state, 0, read)
        self.state, self.length = state, len(state)
        self.ids = {m.id: i for i, m in enumerate(state)}
        self.results, self.calls = found.results, found.calls
        self.pending = {p.call_id: p for p in found.pending}
        # per_turn: an id declared again -> (index, stored id) of its newest declaration
        self.newest: dict[str, tuple[int, str]] = {}
        if per_turn:
            aliased = {caller_id(call) for call in self.calls if caller_id(call) != call}
            self._note_newest(self.calls, aliased)

    def grown(self, state: list[BaseMessage], start: int,
              views: dict[int, Message] | None = None) -> Index:
        """This index moved to ``state``, whose first ``start`` messages it describes
        (``views``: what the rules read of the messages after them, by object)."""
        if self.read is not None and views:
            self.read.update(views)
        found = _derive(state, start, views)
        for i in range(start, len(state)):
            self.ids[state[i].id] = i
        for call, spots in found.results.items():
            self.results.setdefault(call, []).extend(spots)
            self.pending.pop(call, None)
        if self.per_turn:  # the ids declared for the first time (a copy moves nothing)
            self._note_newest({call: turns for call, turns in found.calls.items()
                               if call not in self.calls}, set(self.newest))
        for call, turns in found.calls.items():
            self.calls.setdefault(call, []).extend(turns)
        for pending in found.pending:
            if pending.call_id not in self.results:
                self.pending.setdefault(pending.call_id, pending)
        self.state, self.length = state, len(state)
        return self


    def _note_newest(self, calls: dict[str, list[tuple[int, int]]], aliased: set[str]) -> None:
        """Keep the newest declaration of each id of ``aliased`` or declared under an
        alias among ``calls`` (stored ids: their declarations)."""
        for call, turns in calls.items():
            caller = caller_id(call)
            if caller != call or caller in aliased:
                held = self.newest.get(caller)
                if held is None or held[0] < turns[0][0]:
                    self.newest[caller] = (turns[0][0], call)

    def facts(self, view: BufferView, batch: list[Message],
              state: list[BaseMessage]) -> BufferView:
        """``view`` with what the ``per_turn`` policy reads of ``state`` (which this index
        describes) for ``batch`` (:class:`~flowmem.plan.BufferView`'s ``newest`` and
        ``firsts``)."""
        answered, declared = per_turn_lookups(batch)
        newest: dict[str, str] = {}
        results = dict(view.results)
        for caller in answered:
            held = self.newest.get(caller)
            if held is not None:
                newest[caller] = held[1]
                spots = self.results.get(held[1])
                if spots:
                    results[held[1]] = is_healed(self._view(state, spots[0]))
        firsts = {call: self._view(state, self.calls[call][0][0]) for call in declared
                  if self.calls.get(call)}
        return BufferView(results, view.declared, view.pending, newest, firsts)

    def _view(self, state: list[BaseMessage], index: int) -> Message:
        """What the rules read of the message at ``index`` of ``state`` (its stored ids)."""
        message = state[index]
        return (self.read or {}).get(id(message)) or pairing(message, True) or {}


def _read_in_order(state: list[BaseMessage]) -> dict[int, Message]:
    """What the ``per_turn`` rules read of a state's messages, the state read in order as
    one append (:func:`flowmem.call_ids.assign`): its stored ids."""
    stored = assign(BufferView(), [pairing(m, True) or role_only(m) for m in state])
    return {id(m): view for m, view in zip(state, stored, strict=True)
            if pairing(m) is not None}


def _derive(state: list[BaseMessage], start: int,
            views: dict[int, Message] | None = None) -> Any:
    """The indexes of ``state[start:]`` (``views``: what the rules read of its messages,
    by object, where it is not :func:`_pairing`'s)."""
    if views is not None:
        return derive_indexes((i, view) for i, view in
                              ((i, views.get(id(state[i])) or pairing(state[i]))
                               for i in range(start, len(state))) if view)
    return derive_indexes((i, view) for i, view in
                          ((i, pairing(state[i])) for i in range(start, len(state))) if view)


_CACHE: OrderedDict[int, Index] = OrderedDict()
_CACHE_SIZE: Final = 64
"""States whose indexes are kept (threads reduced at once); the oldest is dropped."""
_CACHE_LOCK: Final = threading.Lock()


def take(state: list[BaseMessage], per_turn: bool) -> Index | None:
    """The kept index of ``state``, taken out (one update owns it), or ``None``."""
    with _CACHE_LOCK:
        index = _CACHE.pop(id(state), None)
    if index is None or index.state is not state or index.length != len(state) \
            or index.per_turn != per_turn:
        return None
    return index


def remember(index: Index) -> list[BaseMessage]:
    with _CACHE_LOCK:
        _CACHE[id(index.state)] = index
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return index.state
