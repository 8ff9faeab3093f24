"""OpenAI Agents SDK: :class:`FlowmemSession`, a ``Session`` stored in flowmem.

``Runner.run(agent, input, session=FlowmemSession("chat-1", memory))``: the
SDK's Responses input items are stored through :mod:`flowmem.formats` —
:func:`~flowmem.formats.from_responses` turns each ``add_items`` batch into
canonical entries (the model's side of a turn, reasoning items included, is
ONE assistant entry declaring its calls by ``call_id``; each output, user or
system item is one entry), so the buffer rules apply by call id: a re-fired
``function_call_output`` is stored once (MEM-1), a re-sent ``function_call``
is dropped (MEM-2), a call left without output is healed when the next user
item arrives (MEM-3) and a late output replaces the placeholder (MEM-10).

Reading: ``get_items(limit)`` returns the last ``limit`` items (all with
``None``) exactly as they were added — a healed placeholder reads as a
``function_call_output`` — with no MEM-5 repair on read: the SDK compares
the tail with what it wrote, and a call may be open because its output is
on the way. The SDK itself drops calls without output from the input it
prepares for the model; the store heals them when the next user item is
added (MEM-3), so the stored history is sendable from that turn on.

Opaque items: an item the session cannot interpret — neither ``role`` nor
``type``, and not an item reference, such as the envelopes the SDK's
``EncryptedSession`` hands the session it wraps — is stored verbatim as an
opaque entry (:func:`flowmem.formats.opaque_entry`) and read back unchanged.
The rules cannot apply to content they cannot read: an opaque entry declares
and answers no call, so MEM-1/2/3/10 skip it, and no provider rendering
carries it (counted as lost). An item with a ``role`` or a ``type`` is a
Responses item and is validated (the batch is all or nothing).

``pop_item()`` removes exactly the newest ITEM: when the newest entry holds
several (a reasoning item, a message, calls), that entry is rewritten without
its last item; otherwise it is removed (:meth:`flowmem.AsyncMemory.pop`).
Removing or rewriting a stored message is the administrative tier of MEM-15:
flowmem's HTTP service never offers it below admin, while a runtime owning
its memory — the SDK session here — may use it; the buffer's indexes follow
(a popped call's id is no longer declared, so a later result for it is a
plain result).

Requires ``pip install 'flowmem[agents]'``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final

from ..errors import InvalidMessage, MessageTypeError, MissingDependency

try:
    import agents.memory as _sdk_memory
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency("openai-agents", "agents") from exc

from ..async_memory import AsyncMemory
from ..call_ids import CallIds
from ..formats import from_responses, opaque_entry, opaque_item, render_responses
from ..ids import result_id
from ..messages import Message
from ..scopes import ExecutionContext

if TYPE_CHECKING:
    from agents.items import TResponseInputItem



@dataclasses.dataclass
class _Settings:
    """``SessionSettings`` for an SDK that predates it: the default ``limit`` only."""

    limit: int | None = None


_SessionSettings: Any = getattr(_sdk_memory, "SessionSettings", None) or _Settings
"""The SDK's ``SessionSettings`` (:class:`_Settings` on an SDK that predates it)."""


def _session_settings(value: Any) -> Any:
    """``value`` as ``SessionSettings``, refused as the SDK's sessions refuse it.

    ``None`` is the default ``SessionSettings()``; a dict is its fields, and a
    field the settings do not have is a ``TypeError`` (a misspelt ``limitt``
    is never a silent ``limit=None``); anything else is a ``TypeError``.
    """
    if value is None:
        return _SessionSettings()
    if isinstance(value, _SessionSettings):
        return value
    if not isinstance(value, Mapping):
        raise TypeError(f"session must be a SessionSettings instance or a dict, "
                        f"got {type(value).__name__}")
    known = {f.name for f in dataclasses.fields(_SessionSettings) if f.init}
    unknown = sorted(str(name) for name in value if name not in known)
    if unknown:
        raise TypeError(f"Unknown session settings: {', '.join(unknown)}")
    return _SessionSettings(**value)

__all__ = ["FlowmemSession", "entry_items"]

_OUTPUTS: Final = frozenset({"function_call_output", "custom_tool_call_output"})
_POLL: Final = 0.001
"""Seconds a ``pop_item`` waits before trying the session's pop mutex again."""


@asynccontextmanager
async def _polled(lock: threading.Lock) -> AsyncIterator[None]:
    """Hold a thread lock from a coroutine of any loop, polling: a waiter never
    blocks its loop, and no loop owns the lock (an ``asyncio.Lock`` binds to the
    first loop that contends for it)."""
    while not lock.acquire(blocking=False):
        await asyncio.sleep(_POLL)
    try:
        yield
    finally:
        lock.release()


def _plain(item: Any) -> Any:
    """An item as a plain mapping (the SDK sometimes hands pydantic models)."""
    dump = getattr(item, "model_dump", None)
    return dump(exclude_unset=True, mode="json") if callable(dump) else item


def _opaque(item: Any) -> bool:
    """An item of no kind the session can read (an ``EncryptedSession`` envelope): a
    mapping with neither ``role`` nor ``type`` that is not an item reference."""
    return isinstance(item, Mapping) and "role" not in item and "type" not in item \
        and not isinstance(item.get("id"), str)


def _converted(items: list[Any], offset: int) -> list[Message]:
    """:func:`from_responses` of ``items``, an error located in the whole batch."""
    try:
        return from_responses(items)
    except InvalidMessage as exc:
        if not offset or exc.index is None:
            raise
        raise type(exc)(exc.reason, index=exc.index + offset, field=exc.field,
                        where=exc.where) from None


def _entries(items: list[Any]) -> list[Message]:
    """A batch of items as canonical entries: readable runs through
    :func:`from_responses` (strict), each opaque item as an opaque entry."""
    out: list[Message] = []
    run: list[Any] = []
    start = 0
    for index, item in enumerate(items):
        if _opaque(item):
            out.extend(_converted(run, start))
            out.append(opaque_entry(item))
            run, start = [], index + 1
        else:
            run.append(item)
    out.extend(_converted(run, start))
    return out


def entry_items(entry: Message, customs: set[str] | None = None) -> list[dict[str, Any]]:
    """The Responses items ONE stored entry holds, as stored (no MEM-5 repair).

    A ``tool`` entry is rendered behind a stand-in of its call (a lone result
    would be an orphan): a ``custom_tool_call_output`` when ``customs`` holds
    its id, which this function fills from the assistant entries it renders.
    An assistant entry's calls are not answered; an opaque entry holds its item.
    """
    found_opaque = opaque_item(entry)
    if found_opaque is not None:
        return [found_opaque]
    if entry.get("role") == "tool":
        found = result_id(entry)
        if found is None:
            return []
        kind = "custom" if customs is not None and found in customs else "function"
        body = {"name": "_", "input": ""} if kind == "custom" else {"name": "_", "arguments": ""}
        stand_in = {"role": "assistant", "content": None,
                    "metadata": {"tool_calls": [{"id": found, "type": kind, kind: body}]}}
        return list(render_responses([stand_in, entry]).output[1:])
    items = render_responses([entry]).output
    if entry.get("role") != "assistant":
        return list(items)
    if customs is not None:
        customs.update(i["call_id"] for i in items if i.get("type") == "custom_tool_call")
    return [item for item in items if item.get("type") not in _OUTPUTS]


def _without_last_item(entry: Message) -> Message | None:
    """An assistant entry less its newest item (calls, then the message, then the
    items before it), or ``None`` when nothing would be left."""
    if entry.get("role") != "assistant":
        return None
    meta = dict(entry.get("metadata") or {})
    content = entry.get("content")
    kept = dict(meta.get("responses") or {})
    if meta.get("tool_calls"):
        meta["tool_calls"] = meta["tool_calls"][:-1]
        if not meta["tool_calls"]:
            del meta["tool_calls"]
    elif content not in (None, "", []):
        content = None
        kept.pop("item", None)
    elif kept.get("items"):
        kept["items"] = kept["items"][:-1]
    meta["responses"] = kept
    if not meta["responses"]:
        del meta["responses"]
    rest: Message = {"role": "assistant", "content": content, "metadata": meta}
    return rest if entry_items(rest) else None


class FlowmemSession:
    """An OpenAI Agents SDK session (the SDK's ``Session`` protocol) over an AsyncMemory.

    The conversation is (``scope``, ``session_id``) under ``context``. By
    default ``scope="session"`` and the context names ``session_id`` as the
    session, so each SDK session is its own flowmem session; with
    ``scope="user"`` and a context naming the user, a user's sessions live
    under that user (refused without one, MEM-6/7). ``max_messages`` windows
    the buffer; ``session_settings`` (the SDK's ``SessionSettings`` or a dict
    of its fields, validated as the SDK's own sessions validate it, also when
    assigned later; ``None`` is ``SessionSettings()``) gives the default
    ``limit`` of :meth:`get_items`.

    One session object may be used from any event loop and thread at once:
    it holds no loop-bound state, an append is atomic in the store (MEM-12).

    ``call_ids`` is the call-id policy of its appends (:mod:`flowmem.call_ids`):
    ``"strict"`` by default, as the SDK itself refuses a reused call id
    (``ModelBehaviorError``); ``"per_turn"`` for a model provider that reuses
    them. ``memory`` is the given memory under that policy (the same store).
    """

    def __init__(self, session_id: str, memory: AsyncMemory, *, scope: str = "session",
                 context: ExecutionContext | None = None, max_messages: int | None = None,
                 session_settings: Any = None, call_ids: CallIds = "strict") -> None:
        if not isinstance(memory, AsyncMemory):
            raise MessageTypeError(f"memory must be a flowmem AsyncMemory, "
                                   f"got {type(memory).__name__}")
        self.session_id = session_id
        self.memory = memory.with_call_ids(call_ids)
        self.scope = scope
        self.context = context if context is not None else ExecutionContext(
            session_id=session_id)
        self.max_messages = max_messages
        self.session_settings = session_settings
        self._popping = threading.Lock()

    @property
    def session_settings(self) -> Any:
        """The SDK's ``SessionSettings`` of this session (validated when set)."""
        return self._settings

    @session_settings.setter
    def session_settings(self, value: Any) -> None:
        self._settings = _session_settings(value)

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The latest ``limit`` items (``None``: ``session_settings.limit``, then all)
        as added, oldest first (module doc)."""
        if limit is None:
            limit = self._settings.limit
        if limit is not None and limit <= 0:
            return []
        page = await self.memory.history(self.scope, self.session_id, context=self.context,
                                         last=limit)
        customs: set[str] = set()
        items: list[Any] = [item for entry in page.messages
                            for item in entry_items(entry, customs)]
        return items if limit is None else items[-limit:]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append the items with the GR-MEM rules (MEM-1/2/3/10/14); opaque items
        (module doc) are stored as they are."""
        if not items:
            return
        entries = _entries([_plain(item) for item in items])
        await self.memory.append(self.scope, self.session_id, entries, context=self.context,
                                 max_messages=self.max_messages)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item (``None`` when the session is empty)."""
        async with _polled(self._popping):
            while True:
                page = await self.memory.history(self.scope, self.session_id,
                                                 context=self.context, last=1)
                if not page.messages:
                    return None
                items = entry_items(page.messages[0])
                if len(items) > 1:  # the newest turn holds several items: keep the others
                    await self.memory.edit(self.scope, self.session_id, page.positions[0],
                                           _without_last_item(page.messages[0]),
                                           context=self.context)
                    last: Any = items[-1]
                    return last  # type: ignore[no-any-return]
                popped = await self.memory.pop(self.scope, self.session_id,
                                               context=self.context)
                if popped is None:
                    return None
                items = entry_items(popped)
                if items:  # an entry holding no item (none is added so) is skipped
                    last = items[-1]
                    return last  # type: ignore[no-any-return]

    async def clear_session(self) -> None:
        """Delete the conversation."""
        await self.memory.delete(self.scope, self.session_id, context=self.context)
