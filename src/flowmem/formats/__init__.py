"""Provider dialects in and out: OpenAI Chat, OpenAI Responses, Anthropic.

``from_*`` turn a provider transcript into canonical entries (the shape
:func:`flowmem.append` and :class:`flowmem.Memory` store) so the buffer rules
(MEM-1/2/3/10, ids read once through :mod:`flowmem.ids`, MEM-11) apply across
dialects by call id, keeping every provider extra (content parts, ``name``,
``refusal``, reasoning and thinking with their signatures, cache control,
unmodelled Responses items) in the entry. ``to_*`` render a stored history
for a provider: the structural repairs of MEM-5, then that provider's own
sequence rules; what the target cannot carry is dropped and counted
(``render_*`` / :func:`render` return the count), never turned into text.

Pure: imports only the core (:mod:`flowmem.messages`, :mod:`flowmem.ids`,
:mod:`flowmem.normalize`, :mod:`flowmem.errors`). See ``docs/formats.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ..errors import InvalidInput
from ..messages import Message, canonical_messages
from ._common import Rendered, opaque_entry, opaque_item
from .anthropic import from_anthropic, render_anthropic, to_anthropic
from .check import CHECKERS, Problem, check_anthropic, check_openai_chat, check_responses
from .openai_chat import from_openai_chat, render_openai_chat, to_openai_chat
from .openai_responses import from_responses, render_responses, to_responses

__all__ = [
    "FORMATS",
    "Problem",
    "Rendered",
    "check",
    "check_anthropic",
    "check_format",
    "check_openai_chat",
    "check_responses",
    "from_anthropic",
    "from_openai_chat",
    "from_responses",
    "opaque_entry",
    "opaque_item",
    "render",
    "render_anthropic",
    "render_openai_chat",
    "render_responses",
    "to_anthropic",
    "to_canonical",
    "to_openai_chat",
    "to_responses",
]

FORMATS: Final = ("canonical", "openai", "responses", "anthropic")
"""Format names accepted by :func:`to_canonical`, :func:`render` and ``format=``."""


def check_format(format: Any) -> str:
    """``format`` if it names a format, else :class:`~flowmem.errors.InvalidInput`."""
    if not isinstance(format, str) or format not in FORMATS:
        raise InvalidInput(f"format must be one of {list(FORMATS)}, got {format!r}")
    return format


def to_canonical(messages: Any, format: str = "canonical") -> list[Message]:
    """Messages of ``format`` as canonical entries, ready for ``append`` (strict).

    ``canonical`` accepts what :func:`flowmem.append` accepts (canonical or
    flat OpenAI Chat); ``anthropic`` also takes a whole payload
    ``{"system"?, "messages"}``; ``responses`` also ``{"input": ...}`` or a string.
    """
    format = check_format(format)
    if format == "openai":
        return from_openai_chat(messages)
    if format == "responses":
        if isinstance(messages, Mapping) and "input" in messages:
            messages = messages["input"]
        return from_responses(messages)
    if format == "anthropic":
        if isinstance(messages, Mapping) and "messages" in messages:
            return from_anthropic(messages["messages"], system=messages.get("system"))
        return from_anthropic(messages)
    return canonical_messages(messages)


_RENDERERS: Final = {"openai": render_openai_chat, "responses": render_responses,
                     "anthropic": render_anthropic}


def render(history: Any, format: str = "canonical") -> Rendered:
    """A stored history rendered as ``format`` (sendable, MEM-5), with the drop count.

    ``canonical`` returns the history as stored (validated copies), nothing dropped.
    """
    format = check_format(format)
    if format == "canonical":
        return Rendered(canonical_messages(list(history), where="history"), 0)
    return _RENDERERS[format](history)


def check(transcript: Any, format: str) -> list[Problem]:
    """What a provider would refuse in a ``format`` transcript (``[]``: it would accept).

    ``canonical`` is checked as the OpenAI Chat rendering of the stored
    shape would be: by :func:`flowmem.normalize.sendability_problems` (MEM-5).
    """
    format = check_format(format)
    if format == "canonical":
        from ..normalize import sendability_problems

        return [Problem(int(text.split(":")[0].split()[-1]), "MEM-5",
                        text.split(": ", 1)[1]) for text in sendability_problems(transcript)]
    return CHECKERS[format](transcript)
