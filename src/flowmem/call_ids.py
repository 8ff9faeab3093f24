"""The call-id policy: how an append reads a tool call id that a turn declares again.

``"strict"`` (the default) is MEM-2 as the spec states it: an assistant turn whose
every id is already declared is dropped, whatever else it carries (the append
reports it in ``dropped_turns``). Some providers and local models reuse call ids
across turns (``"1"``, ``"call_0"``), and under the strict reading their second
call disappears. ``"per_turn"`` is for those runtimes:

- an id declared again by a turn that is not a copy of an earlier declaration
  (other arguments, or another message id where the dialect carries one), after
  the id's newest declaration was answered, starts a NEW declaration of the id;
- MEM-1, MEM-3 and MEM-10 then act on the id's newest declaration: a result
  pairs with the newest declaration that awaits one, healing gives each open
  declaration its own placeholder, and a late result replaces the placeholder
  of the declaration it pairs with;
- a copy stays a MEM-2 duplicate, and a turn re-declaring an id whose newest
  declaration still awaits its result is judged by MEM-2 against it.

How it is kept: the first declaration of an id is stored under the id itself,
exactly as the strict policy stores it; a later one is stored under an *alias*,
the id plus ``U+001F`` plus 12 hex digits of the turn's fingerprint
(:func:`fingerprint`), written into the stored message, and a result is stored
under the id of the declaration it pairs with. The rules (:mod:`flowmem.plan`)
and every store then work on stored ids as they always do (MEM-1's unique key on
a result's id included), and a copy of a later declaration has the same alias, so
MEM-2 finds it. Two facts are read beside the ids an append mentions
(:class:`~flowmem.plan.BufferView`, for the ids of :func:`per_turn_lookups`): an
id's newest declaration with a result (its alias, or the id itself), which a
result no open declaration awaits is judged against (MEM-1, MEM-10), and the turn
of an id's first declaration, whose fingerprint tells a copy of it (MEM-2). A
per-turn :class:`~flowmem.Memory` gives the caller's ids back on every read
(:func:`caller_messages`) and maps an edit's ids back (:func:`stored_edit`);
under this policy an incoming id holding U+001F is refused. The pass deciding
the stored ids (:func:`assign`) reads the same view as the planner, one batch at
a time (:class:`PerTurn` carries the policy to it through every store).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Literal

from .errors import InvalidInput, InvalidMessage
from .ids import call_id_field, declared_call_ids, result_id
from .messages import Message

__all__ = [
    "CALL_ID_POLICIES",
    "CallIds",
    "PerTurn",
    "assign",
    "caller_id",
    "caller_messages",
    "check_call_ids",
    "fingerprint",
    "per_turn_ids",
    "per_turn_lookups",
    "refuse_aliases",
    "stored_edit",
]

CallIds = Literal["strict", "per_turn"]
CALL_ID_POLICIES: Final = ("strict", "per_turn")
_SEP: Final = "\x1f"
_ALIAS: Final = re.compile(r"(.*)\x1f[0-9a-f]{12}", re.DOTALL)


def check_call_ids(value: Any) -> CallIds:
    """Validate a ``call_ids`` argument: ``"strict"`` or ``"per_turn"``."""
    if value == "strict" or value == "per_turn":
        return "strict" if value == "strict" else "per_turn"
    raise InvalidInput(f"call_ids must be 'strict' or 'per_turn', got {value!r}")


class PerTurn(list[Message]):
    """A batch of canonical messages to plan under the ``per_turn`` policy.

    The planner's entry points (:func:`~flowmem.plan.plan_append`,
    :func:`~flowmem.plan.mentioned_ids`, :func:`~flowmem.plan.needs_pending`) read
    the policy from the batch's type, so every store carries it unchanged.
    """

    __slots__ = ()


def _alias(call: str, print_: str) -> str:
    return f"{call}{_SEP}{print_}"


def caller_id(stored: str) -> str:
    """The caller's id of a stored id (an alias loses its suffix)."""
    if _SEP not in stored:
        return stored
    matched = _ALIAS.fullmatch(stored)
    return stored if matched is None else matched.group(1)


def _message_id(message: Message) -> Any:
    metadata = message.get("metadata") or {}
    found = metadata.get("id")
    if found is None:
        kept = metadata.get("langchain")
        if isinstance(kept, Mapping):
            found = kept.get("id")
    return found


def _entries(message: Message) -> list[Any]:
    metadata = message.get("metadata") or {}
    entries = message.get("tool_calls") or metadata.get("tool_calls") or []
    return list(entries) if isinstance(entries, list | tuple) else []


def fingerprint(message: Message, call: str) -> str:
    """12 hex digits naming the declaration of ``call`` by ``message``: its message id
    (where the dialect carries one) and the call entry without its id (name, arguments).
    Two declarations with the same fingerprint are copies."""
    entry: Any = None
    for candidate in _entries(message):
        field = call_id_field(candidate)
        if field is not None and str(candidate[field]).strip() == call:
            entry = {k: v for k, v in candidate.items() if k not in ("id", "tool_call_id")}
            break
    text = json.dumps([_message_id(message), entry], sort_keys=True, default=str,
                      ensure_ascii=True)
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


def refuse_aliases(incoming: Sequence[Message]) -> None:
    """Refuse (:class:`~flowmem.errors.InvalidMessage`) an incoming id holding U+001F:
    under ``per_turn`` that character starts a stored alias, and an id holding it would
    read as another declaration's, or fall in the range of another id's aliases that
    the SQL stores look up (``result_id >= id || U+001F``)."""
    for index, message in enumerate(incoming):
        answered = result_id(message)
        for call in ([] if answered is None else [answered]) + declared_call_ids(message):
            if _SEP in call:
                raise InvalidMessage(f"call id {call!r} holds U+001F, which starts a stored "
                                     "alias: refused under call_ids='per_turn'",
                                     index=index, field="tool_call_id")


def per_turn_ids(incoming: Sequence[Message]) -> set[str]:
    """The ids :func:`assign` and then the planner look up: each id a turn declares, with
    its alias for that turn, and each id a result answers."""
    ids: set[str] = set()
    for message in incoming:
        role = message["role"]
        if role == "assistant":
            for call in declared_call_ids(message):
                ids.add(call)
                ids.add(_alias(call, fingerprint(message, call)))
        elif role == "tool":
            answered = result_id(message)
            if answered is not None:
                ids.add(answered)
    return ids


class _Open:
    """The declarations awaiting a result, by caller id: the view's (stored) and this
    batch's; a stored one is closed once this batch answers or heals it. ``latest``:
    the stored id of each caller's id's newest declaration this batch answered, healed
    or added (:meth:`answered` reads the view's ``newest`` past it)."""

    def __init__(self, pending: Iterable[Any]) -> None:
        self.stored: dict[str, tuple[Any, str]] = {}
        for call in pending:
            turn = call.turn if isinstance(call.turn, int) else -1
            rank = (turn, call.order)
            caller = caller_id(call.call_id)
            if caller not in self.stored or self.stored[caller][0] < rank:
                self.stored[caller] = (rank, call.call_id)
        self.here: dict[str, str] = {}
        self.latest: dict[str, str] = {}

    def newest(self, caller: str) -> str | None:
        found = self.here.get(caller)
        if found is None:
            held = self.stored.get(caller)
            found = None if held is None else held[1]
        return found

    def close(self, caller: str, stored: str) -> None:
        if self.here.pop(caller, None) is None:
            self.stored.pop(caller, None)
        self.latest[caller] = stored

    def heal(self) -> None:
        for caller, (_, stored) in self.stored.items():
            self.latest[caller] = stored
        self.latest.update(self.here)
        self.here.clear()
        self.stored.clear()


def per_turn_lookups(incoming: Sequence[Message]) -> tuple[set[str], set[str]]:
    """The caller's ids whose :attr:`~flowmem.plan.BufferView.newest` (the ids results
    answer) and :attr:`~flowmem.plan.BufferView.firsts` (the ids turns declare) a store
    looks up for a ``per_turn`` batch."""
    answered: set[str] = set()
    declared: set[str] = set()
    for message in incoming:
        role = message["role"]
        if role == "assistant":
            declared.update(declared_call_ids(message))
        elif role == "tool":
            found = result_id(message)
            if found is not None:
                answered.add(found)
    return answered, declared


def assign(view: Any, incoming: Sequence[Message]) -> list[Message]:
    """``incoming`` with each call id replaced by the stored id the ``per_turn`` policy
    gives it (module notes): a message whose ids stay is the same object."""
    open_ = _Open(view.pending)
    declared, results = view.declared, view.results
    here: set[str] = set()  # stored ids this batch declares
    firsts: dict[str, Message] = {}  # the first declarations this batch adds, by id
    out: list[Message] = []
    for message in incoming:
        role = message["role"]
        if role == "assistant":
            renamed: dict[str, str] = {}
            for call in declared_call_ids(message):
                stored = open_.newest(call)
                if stored is None:
                    if call in here or call in declared:
                        print_ = fingerprint(message, call)
                        stored = _alias(call, print_)
                        if stored in here or stored in declared:
                            pass  # a copy of a later declaration (MEM-2)
                        elif _first_print(call, firsts, view.firsts) == print_:
                            stored = call  # a copy of the id's first declaration (MEM-2)
                        else:
                            open_.here[call] = stored  # a new declaration of the id
                    else:
                        stored = call  # the id's first declaration: stored as it is
                        firsts[call] = message
                        if results.get(call) is None:
                            open_.here[call] = call
                        else:
                            open_.latest[call] = call
                here.add(stored)
                if stored != call:
                    renamed[call] = stored
            out.append(_renamed_turn(message, renamed) if renamed else message)
        elif role == "tool":
            answered = result_id(message)
            stored = None if answered is None else open_.newest(answered)
            if answered is not None:
                if stored is not None:
                    open_.close(answered, stored)
                else:  # no declaration awaits it: the id's newest declaration judges it
                    stored = open_.latest.get(answered) or view.newest.get(answered)
            if stored is None or stored == answered:
                out.append(message)
            else:
                out.append(_renamed_result(message, stored))
        else:
            if role == "user":
                open_.heal()  # MEM-3: the planner heals every open declaration here
            out.append(message)
    return out


def _first_print(call: str, here: Mapping[str, Message],
                 stored: Mapping[str, Message]) -> str | None:
    """The fingerprint of the first declaration of ``call`` (this batch's, else the
    view's), or ``None`` when neither knows it."""
    first = here.get(call)
    if first is None:
        first = stored.get(call)
    return None if first is None else fingerprint(first, call)


def _renamed_turn(message: Message, renamed: Mapping[str, str]) -> Message:
    metadata = dict(message.get("metadata") or {})
    entries = []
    for entry in _entries(message):
        field = call_id_field(entry)
        if field is not None:
            call = str(entry[field]).strip()
            if call in renamed:
                entry = {**entry, field: renamed[call]}
        entries.append(entry)
    if "tool_calls" in message:
        return {**message, "tool_calls": entries}
    metadata["tool_calls"] = entries
    return {**message, "metadata": metadata}


def _renamed_result(message: Message, stored: str) -> Message:
    metadata = dict(message.get("metadata") or {})
    metadata["tool_call_id"] = stored
    renamed = {**message, "metadata": metadata}
    if "tool_call_id" in message:
        renamed["tool_call_id"] = stored
    return renamed


def _restored(message: Message) -> Message:
    role = message.get("role")
    if role == "tool":
        answered = result_id(message)
        if answered is None or _SEP not in answered:
            return message
        return _renamed_result(message, caller_id(answered))
    if role == "assistant":
        calls = declared_call_ids(message)
        back = {call: caller_id(call) for call in calls if _SEP in call}
        back = {call: mine for call, mine in back.items() if mine != call}
        return _renamed_turn(message, back) if back else message
    return message


def caller_messages(messages: list[Message]) -> list[Message]:
    """``messages`` as stored, with every alias given back as the caller's id."""
    return [_restored(message) for message in messages]


def stored_edit(stored: Message, replacement: Message) -> Message:
    """``replacement`` for the stored entry ``stored`` (an edit, MEM-15) with each caller's
    id that ``stored`` holds under an alias given that alias back: the edited entry
    keeps its declarations' and its result's stored ids, as every read shows them."""
    if replacement["role"] == "tool":
        held, answered = result_id(stored), result_id(replacement)
        if held is not None and held != answered and caller_id(held) == answered:
            return _renamed_result(replacement, held)
        return replacement
    aliases = {caller_id(call): call for call in declared_call_ids(stored) if _SEP in call}
    renamed = {call: aliases[call] for call in declared_call_ids(replacement)
               if call in aliases and aliases[call] != call}
    return _renamed_turn(replacement, renamed) if renamed else replacement
