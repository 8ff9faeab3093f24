"""The one JSON codec of the stores: how SQLite, PostgreSQL and Redis write a value or message.

Compact, ASCII-only JSON text (NUL and lone surrogates escaped), so every
backend stores the same bytes and the service can send a stored message on
without encoding it again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from json.encoder import c_encode_basestring_ascii, c_make_encoder  # type: ignore[attr-defined]
from typing import Any, Final

__all__ = ["decode", "decode_all", "encode"]

_ENCODER: Final = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), allow_nan=False)
# ``JSONEncoder.encode`` builds its C encoder again on every call (a third of the cost of
# encoding a message); this one is built once. No circular-reference markers: a value to
# store is a tree (canonical messages are copies), and shared markers could go stale.
_C_ENCODER: Final = (None if c_make_encoder is None else c_make_encoder(
    None, _ENCODER.default, c_encode_basestring_ascii, None, ":", ",", False, False, False))


def encode(value: Any) -> str:
    """JSON text, ASCII only (NUL and lone surrogates escaped)."""
    if _C_ENCODER is None:  # pragma: no cover - CPython has the C encoder
        return _ENCODER.encode(value)
    return "".join(_C_ENCODER(value, 0))


def decode(text: str) -> Any:
    """The inverse of :func:`encode`."""
    return json.loads(text)


def decode_all(texts: Sequence[str]) -> list[Any]:
    """:func:`decode` of each text, in ONE parse of the JSON array they make (half the
    cost of one call per text: a page of messages is read whole)."""
    return json.loads("[" + ",".join(texts) + "]") if texts else []
