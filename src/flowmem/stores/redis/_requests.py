"""The vocabulary of the Redis programs: requests, replies, errors, and the script calls.

A program (:mod:`flowmem.stores.redis._programs`) is a generator that yields
requests and receives their replies:

:class:`Pipe`
    commands sent in one round trip (``MULTI``/``EXEC`` when ``transaction``);
    the reply is the list of their replies, where a command's server error is
    a :class:`~flowmem.errors.StoreError` *value* (redis-py's
    ``raise_on_error=False``) — :class:`NoScript` for an unknown script.
    ``pin``: a key; every command runs on one connection of the node serving
    it (a script and the ``WAIT`` that confirms it, :class:`Confirm`).
:class:`Sleep`
    a pause (the bounded MEM-12 wait's backoff); the reply is ``None``.
:class:`Scan`
    the names of the keys matching a pattern (an erasure's sweep).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from ...errors import (
    IdempotencyConflict,
    InvalidStoreURL,
    KeyConflict,
    OutcomeUnknown,
    StoreError,
    StoreUnavailable,
)
from ...pages import UNPARSED
from ...retention import Expiry
from ...store import HistoryPage, Idempotency
from . import _scripts as lua
from ._keys import Names

__all__ = [
    "POLL_MAX",
    "POLL_START",
    "SCRIPTS",
    "SHAS",
    "Command",
    "Confirm",
    "NoScript",
    "Pipe",
    "Program",
    "Request",
    "Scan",
    "Sleep",
    "T",
    "changes",
    "confirmation",
    "first_error",
    "held",
    "idem_conflict",
    "key_conflict",
    "ms",
    "page_of",
    "retention_args",
    "retried",
    "script",
    "setup",
    "waited",
]

T = TypeVar("T")
POLL_START: Final = 0.0002
POLL_MAX: Final = 0.002
"""The backoff of a bounded wait (MEM-12's lease polls, a re-plan after conflicts), s."""
SCRIPTS: Final = (lua.APPLY, lua.READ, lua.HISTORY, lua.WRITE, lua.DELETE, lua.EDIT,
                  lua.RELEASE, lua.ERASE, lua.LIST, lua.TOUCH)
SHAS: Final = {src: hashlib.sha1(src.encode()).hexdigest() for src in SCRIPTS}
_CHANGING: Final = frozenset(s for src in (lua.APPLY, lua.WRITE, lua.DELETE, lua.EDIT,
                                            lua.ERASE)
                             for s in (src, SHAS[src]))
"""The scripts (their text and their SHA) that change a key's data."""
_UNCHANGED: Final = frozenset((b"locked", b"conflict", b"unlisted", b"value", b"idem_conflict",
                               b"erased", b"conversation"))
"""The first word of a changing script's reply when it changed nothing (a refusal)."""


def changes(request: Request) -> bool:
    """Whether ``request`` runs a script that changes data: its answer lost, the change
    may or may not have been made (:class:`~flowmem.errors.OutcomeUnknown`)."""
    return isinstance(request, Pipe) and any(
        len(command) > 1 and command[0] in ("EVALSHA", "EVAL") and command[1] in _CHANGING
        for command in request.commands)
Command = tuple[Any, ...]


class NoScript(StoreError):
    """The server does not know a script (flushed or restarted): load it and retry."""


@dataclass(frozen=True, slots=True)
class Pipe:
    """Commands in one round trip; ``MULTI``/``EXEC`` when ``transaction``; all on one
    connection of the node serving the key ``pin`` when given (a cluster)."""

    commands: tuple[Command, ...]
    transaction: bool = False
    pin: bytes | None = None


def waited(request: Request) -> float:
    """The seconds the ``WAIT`` commands of ``request`` may block the server's reply."""
    if not isinstance(request, Pipe):
        return 0.0
    return sum(int(c[2]) / 1000 for c in request.commands if c[0] == "WAIT")


@dataclass(frozen=True, slots=True)
class Confirm:
    """``WAIT replicas timeout_ms`` after every script that changes data (the URL's
    ``wait_replicas`` and ``wait_timeout``), on the script's own connection.

    ``WAIT`` answers how many replicas acknowledged the connection's last write
    (a replay writes too: its record's own expiry instant). Fewer than
    ``replicas`` within the timeout: the change is on the primary only, so a
    failover may lose it — :class:`~flowmem.errors.OutcomeUnknown`, not an
    acknowledgement.
    """

    replicas: int
    timeout_ms: int

    def command(self) -> Command:
        return ("WAIT", self.replicas, self.timeout_ms)

    def check(self, acked: Any) -> None:
        """Raise :class:`~flowmem.errors.OutcomeUnknown` unless ``acked`` (WAIT's reply)
        counts ``replicas``."""
        if isinstance(acked, int) and acked >= self.replicas:
            return
        said = (f"WAIT counted {acked}" if isinstance(acked, int)
                else f"WAIT failed: {acked}")
        raise OutcomeUnknown(
            f"Redis applied the change on the primary, but {self.replicas} replica(s) did "
            f"not confirm it within {self.timeout_ms / 1000:g} s ({said}): it may or may "
            f"not survive a failover; retry with the same idempotency key (it is then "
            f"stored once, and confirmed)")


def confirmation(replicas: int, timeout: float) -> Confirm | None:
    """The :class:`Confirm` of ``?wait_replicas=&wait_timeout=`` (``None``: 0 replicas)."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise InvalidStoreURL(f"wait_replicas must be a whole number >= 0, got {replicas!r}")
    if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
        raise InvalidStoreURL(f"wait_timeout must be positive seconds, got {timeout!r}")
    return Confirm(replicas, max(1, math.ceil(timeout * 1000))) if replicas else None


@dataclass(frozen=True, slots=True)
class Sleep:
    """Pause ``seconds`` (never blocking an event loop on the asyncio face)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Scan:
    """The names of every key matching ``match`` (``SCAN``, on every node of a cluster);
    an erasure's sweep, never an operation's."""

    match: bytes
    count: int = 1000


Request = Pipe | Sleep | Scan
Program = Generator[Request, Any, T]
"""A Redis program: yields :data:`Request` s, receives their replies, returns ``T``."""


def page_of(reply: Sequence[Any]) -> HistoryPage:
    """The page of a ``page()`` reply (``HISTORY``'s, or an ``APPLY``'s tail):
    ``{more, total, pos, body...}``, its messages left to parse from their texts."""
    positions = [int(p) for p in reply[2::2]]
    texts = [body.decode() for body in reply[3::2]]
    more = bool(reply[0]) and bool(positions)
    return HistoryPage(UNPARSED, positions, positions[0] if more else None, int(reply[1]),
                       texts)


def ms(instant: float | None) -> int | str:
    """An instant (seconds since the epoch) as the scripts take it: whole milliseconds
    (``""``: none)."""
    return "" if instant is None else math.floor(instant * 1000)


def retention_args(expiry: Expiry | None) -> tuple[Any, Any, str]:
    """A write script's retention arguments: the caller's clock, the instant, renew."""
    if expiry is None:
        return "", "", ""
    return ms(expiry.now), ms(expiry.at), "1" if expiry.renew else ""


def first_error(replies: Sequence[Any]) -> None:
    """Raise the first server error among ``replies``."""
    for reply in replies:
        if isinstance(reply, StoreError):
            raise reply


def held(reply: Any) -> bool:
    """``SET NX`` replies ``True``/``OK`` when it took the lease, ``RENEW`` ``1`` when it
    extended it; anything else (``None``, ``0``) means another token holds it."""
    return reply is True or reply == 1 or reply == b"OK"


def key_conflict(names: Names) -> KeyConflict:
    """The error of a conversation operation on a key holding a plain value."""
    key = names.member.decode("utf-8", "surrogatepass")
    return KeyConflict(f"key {key!r} holds a plain value, not a conversation")


def idem_conflict(idempotency: Idempotency | None) -> IdempotencyConflict:
    """The error of an idempotency key repeated with another request."""
    key = idempotency.key if idempotency is not None else ""
    return IdempotencyConflict(f"idempotency key {key!r} was used for a different request; "
                               "a retry must repeat it exactly")


def retried(make: Callable[[], Program[T]]) -> Program[T]:
    """Run a read-only (or repeatable) program, again once if the connection dropped."""
    try:
        return (yield from make())
    except StoreUnavailable:
        return (yield from make())


def _loaded(reply: Any) -> None:
    if isinstance(reply, StoreError):
        raise StoreError(f"cannot load flowmem's Lua scripts (Redis 7.0+ needed): {reply}")


def setup(cluster: bool = False) -> Program[None]:
    """A store's first round trip (fails fast when unreachable): on a standalone server
    every script loaded; on a cluster a ``PING`` (scripts load on each node as they
    are first run: :func:`script` falls back to ``EVAL``, so a failover or a new node
    needs no setup step)."""
    if cluster:
        first_error((yield Pipe((("PING",),))))
        return
    for reply in (yield Pipe(tuple(("SCRIPT", "LOAD", src) for src in SCRIPTS))):
        _loaded(reply)


def script(src: str, keys: Sequence[bytes], args: Sequence[Any],
           confirm: Confirm | None = None) -> Program[Any]:
    """``EVALSHA``; on NOSCRIPT (a restarted, failed-over or new node) ``EVAL`` once,
    which runs it and leaves it loaded on that node.

    ``confirm`` (a script that changes data): its ``WAIT`` follows the script in the
    same round trip, on the same connection, and a change it does not confirm raises
    :class:`~flowmem.errors.OutcomeUnknown` — unless the reply is a refusal that
    changed nothing (the program raises or retries on it as without ``confirm``).
    """
    wait = () if confirm is None else (confirm.command(),)
    pin = None if confirm is None else keys[0]
    replies = yield Pipe((("EVALSHA", SHAS[src], len(keys), *keys, *args), *wait), pin=pin)
    if isinstance(replies[0], NoScript):
        replies = yield Pipe((("EVAL", src, len(keys), *keys, *args), *wait), pin=pin)
    first_error(replies[:1])
    reply = replies[0]
    head = reply[0] if isinstance(reply, list) and reply else reply
    if confirm is not None and head not in _UNCHANGED:
        confirm.check(replies[1])
    return reply
