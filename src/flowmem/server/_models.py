"""Request bodies (pydantic): what ``/openapi.json`` says each door takes.

Requests are strict (#9): unknown fields are refused, and a field takes only
its own JSON type — ``true`` is not a number, ``"5"`` is not an integer.
Messages allow provider fields (``name``, ``tool_calls``, ...): the
canonical shape keeps them in ``metadata``. No request body carries an
identity: the caller is always the bearer token's user.

The response bodies are in :mod:`._response_models`.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ..messages import dialect_mistake
from ._budget_fields import COUNTER_NAMES, CounterField, KeepSystem, MaxTokens
from ._limits import Limits

__all__ = [
    "COUNTER_NAMES",
    "AppendBody",
    "EditBody",
    "EmptyBody",
    "GrantBody",
    "HistoryBody",
    "MemoryContext",
    "MessageIn",
    "ReadBody",
    "ScopedBody",
    "SessionCreate",
    "TurnBody",
    "WriteBody",
]

_DEFAULTS = Limits()
Id = Annotated[str, Field(min_length=1, max_length=256)]
Key = Annotated[str, Field(min_length=1, max_length=512, description="The memory key.")]
Scope = Literal["global", "workflow", "pipeline", "execution", "session", "user"]


MAX_WINDOW = 2**31 - 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class EmptyBody(_Strict):
    """A door whose body is optional: absent reads as ``{}``; no field is known."""


class MessageIn(BaseModel):
    """A message, canonical (``role``, ``content``, ``metadata``) or provider-flat."""

    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra={
        "description": f"A message. `content` is any JSON; as text (JSON text when it is not "
                       f"a string) it is at most {_DEFAULTS.max_content_chars} characters."})

    role: Literal["system", "user", "assistant", "tool"]
    content: Any = None
    metadata: dict[str, Any] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: StrictStr | StrictInt | None = None


Messages = Annotated[list[MessageIn], Field(
    min_length=1, max_length=_DEFAULTS.max_messages_per_append,
    description=f"At most {_DEFAULTS.max_messages_per_append} messages per append.")]
ProviderItems = Annotated[list[dict[str, Any]], Field(
    min_length=1, max_length=_DEFAULTS.max_messages_per_append,
    description="Messages or items of the dialect `format` names (OpenAI Chat, OpenAI "
                "Responses, Anthropic; see docs/formats.md), converted before the append.")]
Format = Annotated[Literal["canonical", "openai", "responses", "anthropic"], Field(
    description="The dialect of `messages` in, or of `rendered` out (docs/formats.md).")]
Window = Annotated[StrictInt | None, Field(
    ge=1, le=MAX_WINDOW, description="Keep at most this many messages (oldest evicted; "
                                     "session messages: admin only, MEM-15); none: unbounded.")]


class MemoryContext(_Strict):
    """The runtime's execution ids. The user id is never here: it is the token's."""

    workflow_id: Id | None = None
    pipeline_id: Id | None = None
    execution_id: Id | None = None
    node_id: Id | None = None


class ScopedBody(_Strict):
    """Where a memory lives: scope, key, execution ids, and optionally a session.

    With ``session_id`` (which the caller must be allowed to view for reads and
    to drive for writes) the ``session`` scope is that session and the ``user``
    scope its OWNER, only when the owner is a real user (MEM-8). Without it
    the ``user`` scope is the caller (refused for anonymous, MEM-6/MEM-7) and
    the ``session`` scope is refused (MEM-13).
    """

    scope: Scope
    key: Key
    context: MemoryContext = Field(default_factory=MemoryContext)
    session_id: Id | None = None


class ReadBody(ScopedBody):
    """Read a value (a conversation reads as its message list)."""

    default: Any = None


class WriteBody(ScopedBody):
    """Write a JSON value; over a conversation only with ``replace`` (else 409 key_conflict)."""

    value: Any
    replace: bool = Field(default=False, description=(
        "Replace a conversation the key holds by this value (without it: 409 key_conflict, "
        "nothing changed)."))


_CANONICAL: Final = TypeAdapter(Messages)


class _Incoming(BaseModel):
    """``messages`` in the dialect ``format`` names; canonical ones typed strictly."""

    messages: Messages | ProviderItems
    format: Format = "canonical"

    @model_validator(mode="after")
    def _strict_when_canonical(self) -> _Incoming:
        if self.format == "canonical" and any(not isinstance(m, MessageIn)
                                              for m in self.messages):
            mistaken = dialect_mistake(self.messages)
            if mistaken is not None:
                raise ValueError(mistaken)  # names the dialect and its converter
            try:
                self.messages = _CANONICAL.validate_python(self.messages)
            except ValidationError as exc:  # located under messages, as documented
                raise ValidationError.from_exception_data(exc.title, [
                    {"type": PydanticCustomError(str(e["type"]), str(e["msg"])),
                     "loc": ("messages", *e["loc"]), "input": e.get("input")}
                    for e in exc.errors()]) from None
        return self


class AppendBody(_Incoming, ScopedBody):
    """Append messages to the conversation at (scope, key), MEM-1..14."""

    max_messages: Window = None


class HistoryBody(ScopedBody):
    """A page of the conversation at (scope, key), newest last (API-6 paging).

    ``limit`` (or its older name ``last``) is clamped to 1..100, ``offset`` —
    how many of the newest messages to skip — floored at 0. ``before`` pages
    from a position cursor (the previous page's ``before``) at constant cost.
    ``max_tokens`` (with ``counter``, ``keep_system``) reads under a token
    budget instead.
    """

    limit: StrictInt | None = Field(None, description="Page size, clamped to 1..100 (default 50).")
    last: StrictInt | None = Field(None, description="The older name of `limit`.")
    offset: StrictInt | None = Field(None, description="Newest messages to skip, floored at 0.")
    before: Annotated[StrictInt | None, Field(
        ge=0, le=2 ** 62, description="Cursor from the previous page's ``before``.")] = None
    format: Format = "canonical"
    max_tokens: MaxTokens = None
    counter: CounterField = None
    keep_system: KeepSystem = None


class SessionCreate(_Strict):
    """Create a session owned by the caller (``owner_less``: admin only)."""

    title: Annotated[str, Field(max_length=200)] = ""
    owner_less: StrictBool = False


class TurnBody(_Incoming, _Strict):
    """Append a turn (any roles) to the session's conversation."""

    max_messages: Window = None


class GrantBody(_Strict):
    """Grant view to a user."""

    user_id: Id


class EditBody(_Strict):
    """Replace one stored message (admin only, MEM-15)."""

    message: MessageIn
