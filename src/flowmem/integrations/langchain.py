"""LangChain on flowmem: a chat message history, and the LangChain message mapping.

:class:`FlowmemChatMessageHistory` is a ``BaseChatMessageHistory`` whose
messages live in a flowmem conversation, so every ``add_messages`` is a
flowmem append with the GR-MEM rules: a re-fired ``ToolMessage`` is stored
once (MEM-1), a re-sent ``AIMessage`` is dropped (MEM-2; under the history's
default ``call_ids="per_turn"`` a new ``AIMessage`` reusing an answered call id
is a new call, :mod:`flowmem.call_ids`), an interrupted call is healed before the next
``HumanMessage`` (MEM-3) and its late result replaces the placeholder in
place (MEM-10). :data:`sendable` (``prompt | sendable | model``) gives the
model MEM-5's structural repairs of what it is about to receive.

The mapping (:func:`to_entry` / :func:`from_entry`) is lossless both ways
for what LangChain's own serialization (``message_to_dict``) carries:
content strings and content-block lists (images included), ``tool_calls``
(ids, names, args), ``invalid_tool_calls``, ``tool_call_id``, ``name``,
message ``id``, ``additional_kwargs``, ``response_metadata``,
``usage_metadata``, ``status``, ``ChatMessage.role``. The pairing fields go
where flowmem's rules read them (``metadata.tool_calls`` in the OpenAI Chat
call shape, ``metadata.tool_call_id``, ``metadata.name``), so the stored
history also renders for any provider through :mod:`flowmem.formats`; every
other non-default field is kept under ``metadata["langchain"]``. A
``ToolMessage.artifact`` is kept when it is JSON and dropped otherwise (it
is never sent to a model). A healed placeholder reads as a ``ToolMessage``
with ``status="error"`` and ``additional_kwargs={"healed": True}``.

Requires ``pip install 'flowmem[langchain]'``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from ..errors import InvalidValue, MessageTypeError, MissingDependency, SyncCallOnAsyncMemory

try:
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.messages import (
        AnyMessage,
        BaseMessage,
        BaseMessageChunk,
        message_chunk_to_message,
        message_to_dict,
        messages_from_dict,
    )
    from langchain_core.prompt_values import PromptValue
    from langchain_core.runnables import RunnableLambda
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency("langchain-core", "langchain") from exc

from ..async_memory import AsyncMemory
from ..call_ids import CallIds
from ..ids import call_entries, call_id, is_healed, result_id
from ..memory import Memory
from ..messages import ROLES, Message, json_copy
from ..normalize import repair_pairing
from ..scopes import ExecutionContext

__all__ = [
    "LANGCHAIN",
    "FlowmemChatMessageHistory",
    "from_entries",
    "from_entry",
    "sendable",
    "sendable_messages",
    "to_entries",
    "to_entry",
]

LANGCHAIN: Final = "langchain"
"""The ``metadata`` key holding a LangChain message's fields flowmem does not model."""

_ROLES: Final = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}
_KINDS: Final = {role: kind for kind, role in _ROLES.items()}
_MODELLED: Final = frozenset({"content", "type", "tool_calls", "tool_call_id", "name"})


# --------------------------------------------------------------------------- mapping

def _role(kind: str, body: dict[str, Any]) -> str:
    role = _ROLES.get(kind)
    if kind == "chat" and body.get("role") in ROLES:
        role = body["role"]
    if role is None:
        raise MessageTypeError(f"a LangChain {kind!r} message has no flowmem role "
                               f"(use HumanMessage, AIMessage, SystemMessage, ToolMessage "
                               f"or a ChatMessage with role in {sorted(ROLES)})")
    return role


def _openai_call(call: dict[str, Any]) -> dict[str, Any]:
    """A LangChain ``ToolCall`` in the OpenAI Chat shape flowmem's rules read (MEM-11)."""
    return {"id": call.get("id"), "type": "function",
            "function": {"name": call.get("name"), "arguments": json.dumps(call.get("args"))}}


def _kept(message: BaseMessage, body: dict[str, Any]) -> dict[str, Any]:
    """The fields outside the modelled ones that differ from their defaults."""
    fields = type(message).model_fields
    kept: dict[str, Any] = {}
    for name, value in body.items():
        if name in _MODELLED or (name in fields and
                                 value == fields[name].get_default(call_default_factory=True)):
            continue
        if name == "artifact":
            try:
                value = json_copy(value)
            except InvalidValue:
                continue  # not JSON: never sent to a model, not stored
        kept[name] = value
    return kept


def to_entry(message: BaseMessage) -> Message:
    """A LangChain message as a flowmem entry (canonical shape, see the module doc)."""
    if isinstance(message, BaseMessageChunk):
        message = message_chunk_to_message(message)
    if not isinstance(message, BaseMessage):
        raise MessageTypeError(f"expected a LangChain message, got {type(message).__name__}")
    dumped = message_to_dict(message)
    kind, body = dumped["type"], dumped["data"]
    role = _role(kind, body)
    meta: dict[str, Any] = {}
    if body.get("tool_calls"):
        meta["tool_calls"] = [_openai_call(call) for call in body["tool_calls"]]
    if role == "tool":
        meta["tool_call_id"] = body.get("tool_call_id")
        if (body.get("additional_kwargs") or {}).get("healed") is True:
            meta["healed"] = True
    if body.get("name") is not None:
        meta["name"] = body["name"]
    kept = _kept(message, body)
    if kind != _KINDS.get(role) or kept:
        meta[LANGCHAIN] = {"type": kind, **kept}
    return {"role": role, "content": body.get("content"), "metadata": meta}


def to_entries(messages: Sequence[BaseMessage]) -> list[Message]:
    """:func:`to_entry` over a list."""
    return [to_entry(message) for message in messages]


def _langchain_call(entry: Any) -> tuple[bool, dict[str, Any]]:
    """A stored call entry as a LangChain ``ToolCall`` (``True``) or ``InvalidToolCall``."""
    body = entry.get("function") if isinstance(entry, dict) else None
    body = body if isinstance(body, dict) else {}
    name, raw = body.get("name"), body.get("arguments")
    found = call_id(entry)
    if isinstance(raw, dict):
        return True, {"name": name, "args": raw, "id": found, "type": "tool_call"}
    try:
        args = json.loads(raw) if isinstance(raw, str) and raw.strip() else {}
    except ValueError:
        args = None
    if isinstance(args, dict):
        return True, {"name": name, "args": args, "id": found, "type": "tool_call"}
    return False, {"name": name, "args": raw if isinstance(raw, str) else None, "id": found,
                   "error": "arguments are not a JSON object", "type": "invalid_tool_call"}


def from_entry(entry: Message) -> BaseMessage:
    """A flowmem entry (any stored or provider-flat message) as a LangChain message."""
    meta = entry.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    role = entry.get("role")
    kept = dict(meta.get(LANGCHAIN) or {})
    kind = kept.pop("type", None) or _KINDS.get(str(role), "chat")
    body: dict[str, Any] = {**kept, "content": "" if entry.get("content") is None
                            else entry["content"]}
    name = entry.get("name", meta.get("name"))
    if name is not None:
        body["name"] = name
    if role == "tool":
        body["tool_call_id"] = result_id(entry) or ""
        if is_healed(entry) and LANGCHAIN not in meta:
            body.update(status="error", additional_kwargs={"healed": True})
    if role == "assistant":
        calls = [_langchain_call(e) for e in call_entries(entry)]
        body["tool_calls"] = [call for ok, call in calls if ok]
        invalid = [call for ok, call in calls if not ok]
        if invalid:
            body["invalid_tool_calls"] = [*body.get("invalid_tool_calls", ()), *invalid]
    if kind == "chat":
        body.setdefault("role", role)
    result: BaseMessage = messages_from_dict([{"type": kind, "data": body}])[0]
    return result


def from_entries(entries: Sequence[Message]) -> list[BaseMessage]:
    """:func:`from_entry` over a list."""
    return [from_entry(entry) for entry in entries]


def _blank(message: Message) -> bool:
    content = message.get("content")
    return content is None or content == "" or content == []


def sendable_messages(messages: PromptValue | Sequence[BaseMessage], *,
                      call_ids: CallIds = "per_turn") -> list[BaseMessage]:
    """The messages with MEM-5's structural repairs, payloads kept (what a model may get).

    System first; an unanswered call answered by the interrupted placeholder
    right after its turn's block; a duplicate or orphan result dropped; a
    result outside its turn's block moved into it; no leading result.
    Messages that need no repair come back as they were. ``call_ids`` is the
    call-id policy, ``"per_turn"`` as the history's: a call id a later
    ``AIMessage`` declares again is a new call, answered in its own block
    (``"strict"`` removes it from the later turn, MEM-5 as stated).
    """
    if isinstance(messages, PromptValue):
        messages = messages.to_messages()
    repaired, _ = repair_pairing(to_entries(messages), blank=_blank, call_ids=call_ids)
    return from_entries(repaired)


sendable: RunnableLambda[PromptValue | Sequence[AnyMessage], list[BaseMessage]] = \
    RunnableLambda(sendable_messages, name="flowmem_sendable")
"""A runnable for ``prompt | sendable | model``: :func:`sendable_messages` as a chain step."""


# --------------------------------------------------------------------------- history

class FlowmemChatMessageHistory(BaseChatMessageHistory):
    """A LangChain chat message history stored in a flowmem conversation.

    ``memory`` is a :class:`~flowmem.Memory` or an :class:`~flowmem.AsyncMemory`;
    the conversation is (``scope``, ``key``) under ``context`` (an identity
    scope without its identity is refused, MEM-6/7/13: reads are empty,
    writes are no-ops, one warning is logged). ``max_messages`` windows the
    buffer on every append. ``messages`` reads the history exactly as stored.

    Over a ``Memory`` the sync methods run directly and the async ones in a
    thread (LangChain's default); over an ``AsyncMemory`` the async methods
    (``aget_messages``, ``aadd_messages``, ``aclear``) are native and the sync
    ones raise :class:`~flowmem.errors.SyncCallOnAsyncMemory`.

    The store heals an interrupted call when the next user message is
    appended (MEM-3), but ``RunnableWithMessageHistory`` calls the model
    before it appends that turn: put :data:`sendable` between the prompt
    and the model (``prompt | sendable | model``) so the model gets the
    call answered. A history cannot do it on read: the next input may be
    the call's real result.

    ``call_ids`` is the call-id policy of its appends (:mod:`flowmem.call_ids`),
    ``"per_turn"`` by default: LangChain messages carry their own ids, and
    models that reuse call ids across turns (``"1"``, ``"call_0"``) are common
    there, so a new ``AIMessage`` re-declaring an answered id is a new call,
    not a duplicate. ``call_ids="strict"`` applies MEM-2 as the spec states it.
    ``memory`` is the given memory under that policy (the same store).
    """

    def __init__(self, memory: Memory | AsyncMemory, scope: str, key: str, *,
                 context: ExecutionContext | None = None,
                 max_messages: int | None = None, call_ids: CallIds = "per_turn") -> None:
        if not isinstance(memory, Memory | AsyncMemory):
            raise MessageTypeError(f"memory must be a flowmem Memory or AsyncMemory, "
                                   f"got {type(memory).__name__}")
        self.memory = memory.with_call_ids(call_ids)
        self.scope = scope
        self.key = key
        self.context = context
        self.max_messages = max_messages

    def _blocking(self, what: str) -> Memory:
        if isinstance(self.memory, AsyncMemory):
            raise SyncCallOnAsyncMemory(
                f"{what} is blocking and this history is over an AsyncMemory: use "
                f"aget_messages / aadd_messages / aclear, or build it over a Memory")
        return self.memory

    # -- sync -----------------------------------------------------------------
    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The conversation as LangChain messages, as stored."""
        memory = self._blocking("messages")
        page = memory.history(self.scope, self.key, context=self.context)
        return from_entries(page.messages)

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append with the GR-MEM rules (MEM-1/2/3/10/14)."""
        memory = self._blocking("add_messages")
        memory.append(self.scope, self.key, to_entries(messages), context=self.context,
                      max_messages=self.max_messages)

    def clear(self) -> None:
        """Delete the conversation."""
        self._blocking("clear").delete(self.scope, self.key, context=self.context)

    # -- async ----------------------------------------------------------------
    async def aget_messages(self) -> list[BaseMessage]:
        """As :attr:`messages`; native over an ``AsyncMemory``."""
        if not isinstance(self.memory, AsyncMemory):
            return await super().aget_messages()
        page = await self.memory.history(self.scope, self.key, context=self.context)
        return from_entries(page.messages)

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        """As :meth:`add_messages`; native over an ``AsyncMemory``."""
        if not isinstance(self.memory, AsyncMemory):
            await super().aadd_messages(messages)
            return
        await self.memory.append(self.scope, self.key, to_entries(messages),
                                 context=self.context, max_messages=self.max_messages)

    async def aclear(self) -> None:
        """As :meth:`clear`; native over an ``AsyncMemory``."""
        if not isinstance(self.memory, AsyncMemory):
            await super().aclear()
            return
        await self.memory.delete(self.scope, self.key, context=self.context)
