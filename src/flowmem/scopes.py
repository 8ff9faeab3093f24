"""Scopes and identity: where a memory lives, and when it is refused (MEM-6, MEM-13).

A storage scope is ``(scope, scope id, key)``. :func:`resolve_scope` is the ONE
refusal decision: every consumer (the :class:`~flowmem.Memory` coordinator,
the HTTP service) asks it and never decides a refusal itself.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Final

from ._frozen import quick_init
from .errors import InvalidInput, ScopeRefused, UnknownScope
from .ids import is_key_text, usable_id

__all__ = [
    "IDENTITY_SCOPES",
    "SCOPES",
    "ExecutionContext",
    "StorageKey",
    "conversation_key",
    "idempotency_prefix",
    "resolve_scope",
]

SCOPES: Final = ("global", "workflow", "pipeline", "execution", "session", "user")
IDENTITY_SCOPES: Final = frozenset({"session", "user"})
_CONTEXT_FIELD: Final = {
    "workflow": "workflow_id",
    "pipeline": "pipeline_id",
    "execution": "execution_id",
    "session": "session_id",
    "user": "user_id",
}


@dataclass(frozen=True, slots=True)
class ExecutionContext:
    """Who and what a memory operation runs for.

    ``user_id`` is the memory principal: for a session-driven execution it is
    the session OWNER's id, never the id of whoever drives the turn (MEM-8).
    ``node_id``, ``pipeline_id`` and ``workflow_id`` name the caller in the
    refusal warning (MEM-7).
    """

    user_id: Any = None
    session_id: Any = None
    workflow_id: Any = None
    pipeline_id: Any = None
    execution_id: Any = None
    node_id: Any = None


@quick_init
@dataclass(frozen=True, slots=True)
class StorageKey:
    """Where one memory lives: scope, resolved scope id, key."""

    scope: str
    scope_id: str
    key: str


def resolve_scope(scope: str, context: ExecutionContext | None) -> str:
    """Resolve ``scope`` to its scope id under ``context``.

    ``global`` resolves to ``""``; ``workflow``, ``pipeline`` and
    ``execution`` to their id in the context, or ``""`` (the shared bucket)
    when it has none or an unusable one. ``user`` (MEM-6) and ``session``
    (MEM-13) resolve to the usable id or raise :class:`ScopeRefused` — never
    ``""``. An unusable id is blank, ``0``/``"0"`` (no user), not a string or
    int, or a bool (a bool is not an identity).

    Raises :class:`UnknownScope` (a ``ValueError``) for a name not in
    :data:`SCOPES`.
    """
    if scope not in SCOPES:
        raise UnknownScope(f"unknown scope {scope!r}; expected one of {', '.join(SCOPES)}")
    if scope == "global":
        return ""
    field = _CONTEXT_FIELD[scope]
    raw = getattr(context, field) if context is not None else None
    resolved = usable_id(raw)
    if resolved is not None:
        return resolved
    if scope in IDENTITY_SCOPES:
        if context is None:
            raise ScopeRefused(scope, "no execution context")
        got = "none given" if raw is None else f"got {raw!r}"
        raise ScopeRefused(scope, f"no usable {field} ({got})")
    return ""


_KNOWN_KEYS: dict[tuple[str, str, str], int] = {}  # hot keys: no blake2b per append


def idempotency_prefix(key: StorageKey) -> str:
    """What every idempotency key of an operation on ``key`` starts with: the storage
    key's :func:`conversation_key` in 16 hex digits and ``:`` (a retry key is scoped to
    the key it names; a swept or erased conversation's records are found by it)."""
    return f"{conversation_key(key) & 0xFFFF_FFFF_FFFF_FFFF:016x}:"


def conversation_key(key: StorageKey) -> int:
    """The one hash of a storage key: a signed 64-bit number, the same everywhere.

    The blake2b of ``scope NUL scope_id NUL key`` (UTF-8, surrogates kept), so
    every process, machine and version agrees on it: idempotency keys are
    scoped by it, the in-process and file locks stripe by it (MEM-12), and
    PostgreSQL leads every table's primary key with it (a distribution key).
    A store that keeps it also keeps the names it came from and checks them,
    so a collision is an error, never a shared conversation.
    """
    names = (key.scope, key.scope_id, key.key)  # a tuple hashes in C, a dataclass does not
    found = _KNOWN_KEYS.get(names)
    if found is None:
        raw = "\x00".join(names).encode("utf-8", "surrogatepass")
        found = int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "big", signed=True)
        if len(_KNOWN_KEYS) >= 4096:
            _KNOWN_KEYS.clear()
        _KNOWN_KEYS[names] = found
    return found


# The bounds every backend can index, checked before anything reaches a store.
MAX_KEY_LENGTH: Final = 512
MAX_KEYS_PAGE: Final = 1000
MAX_IDEMPOTENCY_KEY_LENGTH: Final = 255


def check_key(key: Any) -> str:
    """A key is text every backend can index: 1..MAX_KEY_LENGTH chars, no NUL/surrogate."""
    if (not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH
            or not is_key_text(key)):
        raise InvalidInput(f"key must be a non-empty string of at most {MAX_KEY_LENGTH} "
                           f"characters without NUL or lone surrogates, got {key!r}")
    return key


def check_cursor(name: str, value: Any, *, low: int) -> None:
    """``last``/``before``: None or an int that every backend can index (64-bit)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < 2 ** 63:
        raise InvalidInput(f"{name} must be None or an integer in [{low}, 2**63), got {value!r}")


def check_limit(limit: Any) -> int:
    """A page size of a key listing: an int in [1, MAX_KEYS_PAGE]."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_KEYS_PAGE:
        raise InvalidInput(f"limit must be an integer in [1, {MAX_KEYS_PAGE}], got {limit!r}")
    return limit


def check_idempotency_key(idempotency_key: Any) -> None:
    """An idempotency key is text every backend can index: 1..255 chars, no NUL/surrogate."""
    if (not isinstance(idempotency_key, str) or not idempotency_key
            or len(idempotency_key) > MAX_IDEMPOTENCY_KEY_LENGTH
            or not is_key_text(idempotency_key)):
        raise InvalidInput(f"idempotency_key must be a non-empty string of at most "
                           f"{MAX_IDEMPOTENCY_KEY_LENGTH} characters, got {idempotency_key!r}")
