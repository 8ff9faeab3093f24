"""The access rules of the storage API, pure (no I/O): MEM-8, MEM-9, MEM-15.

Who may do what to a session is decided HERE and nowhere else; the HTTP
service only asks :func:`authorize` and maps the :class:`Decision` to a
status. The rules:

- **Ownership needs a real identity on both sides (MEM-9).** An anonymous
  caller owns nothing; an owner-less session is owned by nobody.
- **View** — the owner, a user the owner granted view to, or an admin.
- **Drive** (append a turn, stop, reset) — the owner or an admin, never a
  viewer: viewing does not allow driving (MEM-9).
- **Manage grants** — the owner or an admin.
- **Create** — identified callers only, owning what they create; only an
  admin may create an owner-less session.
- **Edit a message** (update or delete one) — an admin only (MEM-15); a
  message whose session cannot be loaded is denied, admin included.
- **Memory principal (MEM-8)** — a session-driven execution carries the
  session OWNER's user id, and only when that is a usable id; never the id
  of whoever drives the turn (:func:`memory_principal`).
- **Shared scopes** (``global``, ``workflow``, ``pipeline``, ``execution``) —
  reached only through grants (:class:`Grant`: ``workflow:support-*:write``: the
  scope, a glob on the resolved scope id, ``read`` or ``write``; write implies
  read); an admin reaches every scope; an anonymous caller only what the
  service opted in to (``--anonymous read|write``). The identity scopes are
  not granted: ``user`` is the caller's own (or, under a session, its
  owner's, MEM-8) and ``session`` needs a session the caller may drive
  (:func:`decide_scope`).
- **Hooks (MEM-15)** — an :data:`AccessHook` may add denials; it can never
  grant what the rules deny: a denial by the rules is final and the hooks
  are not even asked. A hook that raises denies (fail closed); the
  :class:`Decision` carries the error for the caller to log (this module
  does no I/O).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from fnmatch import fnmatchcase
from typing import Any, Final

from .ids import usable_id

__all__ = [
    "SESSION_STATUSES",
    "SHARED_SCOPES",
    "AccessHook",
    "Action",
    "Decision",
    "Grant",
    "Level",
    "Principal",
    "SessionRecord",
    "authorize",
    "decide",
    "decide_scope",
    "memory_principal",
    "owns",
]

SESSION_STATUSES: Final = ("idle", "completed", "stopped")
"""A session's status, a closed vocabulary stored and served with one spelling
(STORE-11): ``idle`` — no turn since it was created or reset; ``completed`` —
a turn finished (never ``idle`` again, STORE-12); ``stopped`` — refuses writes."""


SHARED_SCOPES: Final = ("global", "workflow", "pipeline", "execution")
"""The scopes no identity keys: reached through grants only."""


class Level(StrEnum):
    """What a grant allows on a shared scope; ``write`` implies ``read``."""

    READ = "read"
    WRITE = "write"


@dataclass(frozen=True, slots=True)
class Grant:
    """``scope:glob:level`` — e.g. ``workflow:support-*:write``, ``global:*:read``.

    ``scope`` is a shared scope name (or ``*`` for all four); ``pattern`` is an
    :func:`fnmatch.fnmatchcase` glob on the RESOLVED scope id (the shared
    bucket ``""`` matches only ``*``).
    """

    scope: str
    pattern: str
    level: Level

    @classmethod
    def parse(cls, text: str) -> Grant:
        """Parse ``scope:glob:level``; :class:`ValueError` names what is wrong."""
        if not isinstance(text, str) or text.count(":") < 2:
            raise ValueError(f"a grant is scope:glob:read|write, got {text!r}")
        scope, rest = text.split(":", 1)
        pattern, level = rest.rsplit(":", 1)
        if scope != "*" and scope not in SHARED_SCOPES:
            raise ValueError(f"a grant's scope is one of {', '.join(SHARED_SCOPES)} or *, "
                             f"got {scope!r}")
        if level not in ("read", "write"):
            raise ValueError(f"a grant's level is read or write, got {level!r}")
        if not pattern or len(pattern) > 256:
            raise ValueError("a grant's glob is 1..256 characters")
        return cls(scope, pattern, Level(level))

    def covers(self, scope: str, scope_id: str, level: Level) -> bool:
        """Whether this grant allows ``level`` on ``scope`` resolved to ``scope_id``."""
        return ((self.scope == "*" or self.scope == scope)
                and fnmatchcase(scope_id, self.pattern)
                and (self.level is Level.WRITE or level is Level.READ))

    def __str__(self) -> str:
        return f"{self.scope}:{self.pattern}:{self.level.value}"


class Action(StrEnum):
    """What a caller wants to do to a session (the rows of the access table)."""

    VIEW = "view"
    """Read the session record and its messages; read memory under it."""
    DRIVE = "drive"
    """Append a turn, stop, reset; write memory under it (MEM-9)."""
    MANAGE = "manage"
    """Grant or revoke view to other users."""
    EDIT_MESSAGE = "edit_message"
    """Update or delete one stored message (MEM-15: admin only)."""
    CREATE = "create"
    """Create the (proposed) session: its owner is the caller, or nobody (admin)."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who calls: a user id (``None`` for anonymous), the admin flag, the grants.

    Identity only ever comes from a credential (a bearer token), never from a
    request body. An unusable id (blank, ``"0"``, not a string) is anonymous.
    """

    user_id: str | None = None
    admin: bool = False
    grants: tuple[Grant, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "user_id", usable_id(self.user_id))
        object.__setattr__(self, "admin", self.admin is True)

    @classmethod
    def anonymous(cls) -> Principal:
        """The caller without a credential: no identity, owns nothing (MEM-9)."""
        return cls(None, False, ())

    @property
    def identified(self) -> bool:
        """Whether the caller has a real identity."""
        return self.user_id is not None


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """A session as the registry stores it.

    ``owner`` is ``None`` for an owner-less session (only an admin can create
    one); ``viewers`` are the user ids the owner granted view to.
    """

    id: str
    owner: str | None
    title: str = ""
    viewers: frozenset[str] = field(default_factory=frozenset)
    status: str = "idle"
    created_at: float = 0.0
    updated_at: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "owner", usable_id(self.owner))
        object.__setattr__(self, "viewers", frozenset(
            v for v in (usable_id(x) for x in self.viewers) if v is not None))

    def to_json(self) -> dict[str, Any]:
        """The JSON form stored and served (viewers sorted)."""
        return {"id": self.id, "owner": self.owner, "title": self.title,
                "viewers": sorted(self.viewers), "status": self.status,
                "created_at": self.created_at, "updated_at": self.updated_at}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SessionRecord:
        """The inverse of :meth:`to_json`."""
        return cls(id=str(data["id"]), owner=data.get("owner"), title=str(data.get("title", "")),
                   viewers=frozenset(data.get("viewers") or ()),
                   status=str(data.get("status", "idle")),
                   created_at=float(data.get("created_at", 0.0)),
                   updated_at=float(data.get("updated_at", 0.0)))


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to one access question.

    ``visible`` tells whether the caller may know the session exists (it may
    view it); a service answers "not found" to an invisible session and
    "forbidden" to a visible one, so a refusal never reveals a foreign session.
    """

    allowed: bool
    reason: str
    visible: bool = False
    error: str | None = None
    """Set when a hook raised (and so denied): what it raised."""


AccessHook = Callable[[Principal, Action, SessionRecord | None], bool]
"""An extension hook: return ``False`` to deny. It can only ADD denials (MEM-15)."""


def owns(principal: Principal, session: SessionRecord | None) -> bool:
    """Ownership needs a real identity on both sides (MEM-9)."""
    return (session is not None and principal.user_id is not None
            and session.owner is not None and principal.user_id == session.owner)


def _views(principal: Principal, session: SessionRecord) -> bool:
    if principal.admin or owns(principal, session):
        return True
    return principal.user_id is not None and principal.user_id in session.viewers


def decide(principal: Principal, action: Action, session: SessionRecord | None) -> Decision:
    """The ONE access decision of the rules alone (MEM-9, MEM-15), hooks aside."""
    if session is None:
        return Decision(False, "the session cannot be loaded")
    if action is Action.CREATE:
        return _create(principal, session)
    visible = _views(principal, session)
    if action is Action.VIEW:
        return Decision(visible, "may view" if visible else "not a viewer", visible)
    if action is Action.EDIT_MESSAGE:
        if principal.admin:
            return Decision(True, "admin", visible)
        return Decision(False, "messages are immutable below the admin tier (MEM-15)", visible)
    if principal.admin or owns(principal, session):
        return Decision(True, "owner or admin", visible)
    why = "viewing does not allow driving (MEM-9)" if action is Action.DRIVE else "not the owner"
    return Decision(False, why, visible)


def authorize(principal: Principal, action: Action, session: SessionRecord | None,
              hooks: Iterable[AccessHook] = ()) -> Decision:
    """:func:`decide`, then the hooks, which may only add denials (MEM-15).

    A denial by the rules is final: no hook is asked. Each hook is asked in
    order; the first that returns anything but ``True`` (or raises) denies.
    """
    decision = decide(principal, action, session)
    if not decision.allowed:
        return decision
    for hook in hooks:
        try:
            verdict = hook(principal, action, session)
        except Exception as exc:  # fail closed: a broken hook denies
            return Decision(False, "denied by an access hook", decision.visible,
                            error=f"access hook {hook!r} raised {exc!r}")
        if verdict is not True:
            return Decision(False, "denied by an access hook", decision.visible)
    return decision


def decide_scope(principal: Principal, scope: str, scope_id: str, level: Level, *,
                 anonymous: Level | None = None) -> Decision:
    """The ONE decision for a memory operation's scope.

    ``scope_id`` is the scope resolved for the operation (``resolve_scope``);
    ``anonymous`` is what the service lets callers without a token do on the
    shared scopes (``None``: nothing). The identity scopes are allowed here:
    ``user`` is always the caller's own or its session owner's (MEM-6, MEM-8)
    and ``session`` is decided by the session's drive rights (MEM-9); their
    refusal without an identity is MEM-7's neutral one, not a denial.
    """
    if scope not in SHARED_SCOPES:
        return Decision(True, "an identity scope: the caller's own or its session's", True)
    if principal.admin:
        return Decision(True, "admin", True)
    if not principal.identified:
        allowed = anonymous is Level.WRITE or (anonymous is Level.READ and level is Level.READ)
        return Decision(allowed, "anonymous use of the shared scopes" if allowed else
                        f"anonymous callers may not {level.value} the shared scopes", True)
    for grant in principal.grants:
        if grant.covers(scope, scope_id, level):
            return Decision(True, f"granted by {grant}", True)
    return Decision(False, f"no grant to {level.value} {scope} {scope_id!r}", True)


def _create(principal: Principal, proposed: SessionRecord) -> Decision:
    """Identified callers own what they create; only an admin creates owner-less (MEM-9)."""
    if not principal.identified:
        return Decision(False, "an anonymous caller cannot create a session: it owns nothing")
    if proposed.owner is None:
        if principal.admin:
            return Decision(True, "admin creates an owner-less session")
        return Decision(False, "only an admin may create an owner-less session")
    if proposed.owner != principal.user_id:
        return Decision(False, "a session is owned by the caller who creates it")
    return Decision(True, "the caller owns what it creates")


def memory_principal(session: SessionRecord) -> str | None:
    """The user id a session-driven execution carries (MEM-8).

    The session OWNER's id, only when it is a usable id; ``None`` (so the
    ``user`` scope is refused, MEM-6) for an owner-less session — never the
    id of whoever drives the turn.
    """
    return usable_id(session.owner)
