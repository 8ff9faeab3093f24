"""Scopes and identity: where a memory lives, and when it is refused (MEM-6, MEM-13).

A storage scope is ``(scope, scope id, key)``. :func:`resolve_scope` is the ONE
refusal decision: every consumer (the :class:`~flowmem.Memory` coordinator,
the HTTP service) asks it and never decides a refusal itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from ._frozen import quick_init
from .errors import ScopeRefused, UnknownScope
from .ids import usable_id

__all__ = [
    "IDENTITY_SCOPES",
    "SCOPES",
    "ExecutionContext",
    "StorageKey",
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
        raise ScopeRefused(scope, f"no usable {field} (got {raw!r})")
    return ""
