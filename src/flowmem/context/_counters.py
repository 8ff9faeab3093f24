"""Token counters: a small protocol, an approximate counter, and a tiktoken adapter.

A counter is any callable taking the messages *as they will be sent* (the
dialect's own objects: OpenAI Chat messages, Responses input items, Anthropic
messages with the payload's ``system`` given as one leading
``{"role": "system", "content": ...}``) and returning a token count. Both
built-in counters walk those objects the same way: every string value is text
(ids, names, arguments and contents alike) except the structural keys
``role``, ``type`` and ``status``; an image or a document part costs a fixed
number of tokens (its base64 data is never counted as text); each message
costs a fixed overhead and each request a fixed priming.

Pure, no I/O — except that :class:`TiktokenCounter` reads tiktoken's cached
encoding file, and refuses (never downloads) when it is not cached.
"""

from __future__ import annotations

import hashlib
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol, runtime_checkable

from ..errors import FlowmemError

__all__ = [
    "DOCUMENT_TOKENS",
    "IMAGE_TOKENS",
    "ApproximateCounter",
    "TiktokenCounter",
    "TokenCounter",
    "TokenizerUnavailable",
    "approximate",
    "tiktoken_unavailable",
]

IMAGE_TOKENS: Final = 1600
"""The fixed cost of one image part: the largest a provider charges for an image it
resizes itself (Anthropic: about width × height / 750, capped near 1,600; OpenAI:
765 for a 1024×1024 high-detail image, 85 in low detail)."""
DOCUMENT_TOKENS: Final = 3000
"""The fixed cost of one document or file part (a PDF page costs 1,500-3,000 tokens)."""

_MEDIA: Final = frozenset({"image", "image_url", "input_image", "document", "file",
                           "input_file", "input_audio"})
_DOCUMENTS: Final = frozenset({"document", "file", "input_file", "input_audio"})
_STRUCTURAL: Final = frozenset({"role", "type", "status"})


class TokenizerUnavailable(FlowmemError, RuntimeError):
    """A tokenizer cannot count here (not installed, or its encoding file not cached)."""


@runtime_checkable
class TokenCounter(Protocol):
    """Counts the tokens of a list of messages in the dialect they will be sent in."""

    def __call__(self, messages: Sequence[Any], /) -> int:
        """The tokens ``messages`` cost (a request holding exactly them)."""
        ...


def _walk(value: Any, texts: list[str], media: list[int], image: int, document: int) -> None:
    kind: Any = type(value)
    if kind is str:
        texts.append(value)
    elif kind is dict and "type" not in value:  # the common case, without the ABC checks
        for name, item in value.items():
            if type(item) is str:
                if name not in _STRUCTURAL:
                    texts.append(item)
            elif name not in _STRUCTURAL and item is not None:
                _walk(item, texts, media, image, document)
    elif isinstance(value, str):
        texts.append(value)
    elif isinstance(value, Mapping):
        kind = value.get("type")
        if isinstance(kind, str) and kind in _MEDIA:
            media.append(document if kind in _DOCUMENTS else image)
            return
        for name, item in value.items():
            if name not in _STRUCTURAL:
                _walk(item, texts, media, image, document)
    elif isinstance(value, list | tuple):
        for item in value:
            _walk(item, texts, media, image, document)
    elif isinstance(value, bool | int | float):
        texts.append(str(value))


class _WalkingCounter:
    """Per message: its overhead, its texts' tokens, its media's fixed costs."""

    per_message: int = 3
    per_request: int = 3
    image_tokens: int = IMAGE_TOKENS
    document_tokens: int = DOCUMENT_TOKENS

    def text_tokens(self, text: str) -> int:
        raise NotImplementedError

    def __call__(self, messages: Sequence[Any], /) -> int:
        """``per_request`` (for a non-empty request) plus each message's :meth:`message_tokens`:
        additive, so a budget can count a run of messages a message at a time."""
        total = self.per_request if messages else 0
        for message in messages:
            total += self.message_tokens(message)
        return total

    def message_tokens(self, message: Any) -> int:
        """One message's tokens: its overhead, its texts, its media's fixed costs."""
        texts: list[str] = []
        media: list[int] = []
        _walk(message, texts, media, self.image_tokens, self.document_tokens)
        return self.per_message + sum(media) + sum(self.text_tokens(t) for t in texts)


def additive(counter: Any) -> _WalkingCounter | None:
    """``counter`` when its count of a list is ``per_request`` plus the sum of its
    ``message_tokens`` (the built-in counters, not a subclass redefining the call)."""
    if isinstance(counter, _WalkingCounter) and type(counter).__call__ is _WalkingCounter.__call__:
        return counter
    return None


class ApproximateCounter(_WalkingCounter):
    """Characters over ``chars_per_token`` (ASCII) plus one token per other character.

    The published figures: about 4 characters of English per token for OpenAI's
    tokenizers, about 3.5 for Anthropic's. Dividing ASCII by 3.5 therefore
    over-counts OpenAI English text by about 14% and matches Anthropic's
    figure; counting every non-ASCII character as a whole token over-counts
    accented Latin text and matches CJK text (about one token per character).
    It errs on the side of too many tokens, so a budget it keeps is kept by
    the provider's own count in ordinary text; adversarial text (long runs of
    rare ASCII symbols) can cost more. ``per_message`` (3) and ``per_request``
    (3) are OpenAI's published per-message overhead and reply priming.
    """

    def __init__(self, *, chars_per_token: float = 3.5, per_message: int = 3,
                 per_request: int = 3, image_tokens: int = IMAGE_TOKENS,
                 document_tokens: int = DOCUMENT_TOKENS) -> None:
        if chars_per_token <= 0:
            raise ValueError("chars_per_token must be positive")
        self.chars_per_token = chars_per_token
        self.per_message = per_message
        self.per_request = per_request
        self.image_tokens = image_tokens
        self.document_tokens = document_tokens

    def message_tokens(self, message: Any) -> int:
        texts: list[str] = []
        media: list[int] = []
        _walk(message, texts, media, self.image_tokens, self.document_tokens)
        text = "".join(texts)  # ceil once per message (a bit less over-counting)
        if text.isascii():
            return self.per_message + sum(media) + math.ceil(len(text) / self.chars_per_token)
        return self.per_message + sum(media) + self.text_tokens(text)

    def text_tokens(self, text: str) -> int:
        if text.isascii():
            return math.ceil(len(text) / self.chars_per_token)
        ascii_count = sum(1 for char in text if char < "\x80")
        return math.ceil(ascii_count / self.chars_per_token) + len(text) - ascii_count


approximate: Final = ApproximateCounter()
"""The default counter (:class:`ApproximateCounter` with its defaults)."""

_BLOB: Final = "https://openaipublic.blob.core.windows.net/encodings/{}.tiktoken"
_ENCODINGS: Final = ("o200k_base", "cl100k_base", "p50k_base", "r50k_base")


def _cache_file(encoding: str) -> str | None:
    """Where tiktoken keeps ``encoding``'s file (``None``: caching is turned off)."""
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        directory = os.environ["TIKTOKEN_CACHE_DIR"]
    elif "DATA_GYM_CACHE_DIR" in os.environ:
        directory = os.environ["DATA_GYM_CACHE_DIR"]
    else:
        directory = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    if not directory:
        return None
    name = hashlib.sha1(_BLOB.format(encoding).encode()).hexdigest()
    return os.path.join(directory, name)


def tiktoken_unavailable(encoding: str = "o200k_base") -> str | None:
    """Why :class:`TiktokenCounter` cannot count with ``encoding`` here (``None``: it can).

    tiktoken downloads an encoding's file on first use; this never does: an
    encoding whose file is not in tiktoken's cache is unavailable.
    """
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        return "tiktoken is not installed (pip install tiktoken)"
    if encoding not in _ENCODINGS:
        return f"unknown encoding {encoding!r} (one of {list(_ENCODINGS)})"
    path = _cache_file(encoding)
    if path is None or not os.path.exists(path):
        return (f"tiktoken's file for {encoding} is not cached ({path}); tiktoken would "
                "download it from the network, which this counter never does")
    return None


class TiktokenCounter(_WalkingCounter):
    """Exact text tokens from a tiktoken encoding (OpenAI's), the same walk as above.

    ``o200k_base`` is GPT-4o's and later models' encoding, ``cl100k_base``
    GPT-4's and GPT-3.5's. Raises :class:`TokenizerUnavailable`
    when :func:`tiktoken_unavailable` gives a reason. Images and documents
    cost their fixed amounts, as in :class:`ApproximateCounter`.
    """

    def __init__(self, encoding: str = "o200k_base", *, per_message: int = 3,
                 per_request: int = 3, image_tokens: int = IMAGE_TOKENS,
                 document_tokens: int = DOCUMENT_TOKENS) -> None:
        reason = tiktoken_unavailable(encoding)
        if reason is not None:
            raise TokenizerUnavailable(reason)
        import tiktoken

        self.encoding = tiktoken.get_encoding(encoding)
        self.per_message = per_message
        self.per_request = per_request
        self.image_tokens = image_tokens
        self.document_tokens = document_tokens

    def text_tokens(self, text: str) -> int:
        return len(self.encoding.encode(text, disallowed_special=()))
