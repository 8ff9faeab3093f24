"""Binding a round trip's values into its query text, on the client.

Every step of a PostgreSQL program is one simple-protocol query string (several
statements: see :func:`flowmem.stores.postgres._common.query`), so its values
are bound by the client, as psycopg's ``ClientCursor`` binds them. The common
values — ``str``, ``int`` and ``None`` — are quoted here, byte for byte as
psycopg quotes them, for a fraction of its cost (its per-query adaptation
machinery is most of a round trip's client CPU); anything else (another
type, a ``str`` holding NUL or a lone surrogate, a connection whose client
encoding is not UTF-8) goes through psycopg whole, so its errors are psycopg's.

Quoting, as psycopg's: ``'...'`` with ``'`` doubled; ``E'...'`` with ``\\`` and
``'`` doubled when the text holds a backslash (so the literal means the same
whatever ``standard_conforming_strings`` says); a negative integer after a
space (``1- -5``, never the comment ``1--5``). In UTF-8 no byte of a multi-byte
character is a quote or a backslash, so no text can end a literal early.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Final

from ...errors import MissingDependency

try:
    import psycopg
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency("psycopg", "postgres") from exc

from ..sql._program import Statement
from ._common import Begin, query

__all__ = ["bound", "literal"]

_BIGINT: Final = 2**63


class _Unusual(Exception):
    """A value this module leaves to psycopg."""


@lru_cache(maxsize=1024)
def _parts(statement: str) -> tuple[str, ...]:
    return tuple(statement.split("?"))


def literal(value: Any) -> str:
    """``value`` as a SQL literal, as psycopg quotes it (``_Unusual`` when it would not
    be quoted here)."""
    kind = type(value)
    if kind is str:
        text: str = value
        if "\x00" in text:
            raise _Unusual
        if "\\" in text:
            return " E'" + text.replace("\\", "\\\\").replace("'", "''") + "'"
        return "'" + text.replace("'", "''") + "'"
    if kind is int:
        if not -_BIGINT <= value < _BIGINT:
            raise _Unusual
        return str(value) if value >= 0 else f" {value}"
    if value is None:
        return "NULL"
    raise _Unusual


def _fast(statements: Sequence[Statement], head: Begin | None) -> bytes:
    texts = [head.sql] if head is not None else []
    for statement, params in statements:
        if not params:
            texts.append(statement)
            continue
        parts = _parts(statement)
        if len(parts) != len(params) + 1:
            raise _Unusual  # psycopg says what is wrong
        pieces = [parts[0]]
        for value, after in zip(params, parts[1:], strict=True):
            pieces += (literal(value), after)
        texts.append("".join(pieces))
    return "; ".join(texts).encode("utf-8")


def bound(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
          statements: Sequence[Statement], head: Begin | None = None) -> bytes:
    """:func:`~flowmem.stores.postgres._common.query` (``head`` and ``statements``) with
    its values bound: the bytes of one simple-protocol query for ``conn``."""
    if conn.info.encoding == "utf-8":
        try:
            return _fast(statements, head)
        except (_Unusual, UnicodeEncodeError):
            pass
    sql, params = query(statements, head)
    cursor = (psycopg.AsyncClientCursor(conn) if isinstance(conn, psycopg.AsyncConnection)
              else psycopg.ClientCursor(conn))
    return cursor.mogrify(sql, params).encode(conn.info.encoding)
