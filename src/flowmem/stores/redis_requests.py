"""The vocabulary of the Redis programs: requests, replies, errors, and the script calls.

A program (:mod:`flowmem.stores.redis_programs`) is a generator that yields
requests and receives their replies:

:class:`Pipe`
    commands sent in one round trip (``MULTI``/``EXEC`` when ``transaction``);
    the reply is the list of their replies, where a command's server error is
    a :class:`~flowmem.errors.StoreError` *value* (redis-py's
    ``raise_on_error=False``) — :class:`NoScript` for an unknown script.
:class:`Sleep`
    a pause (the bounded MEM-12 wait's backoff); the reply is ``None``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from ..errors import IdempotencyConflict, KeyConflict, StoreError, StoreUnavailable
from ..pages import UNPARSED
from ..store import HistoryPage, Idempotency
from . import redis_scripts as lua
from .redis_layout import Names

__all__ = [
    "POLL_MAX",
    "POLL_START",
    "SCRIPTS",
    "SHAS",
    "Command",
    "NoScript",
    "Pipe",
    "Program",
    "Request",
    "Sleep",
    "T",
    "first_error",
    "held",
    "idem_conflict",
    "key_conflict",
    "load",
    "page_of",
    "retried",
    "script",
    "setup",
]

T = TypeVar("T")
POLL_START: Final = 0.0002
POLL_MAX: Final = 0.002
"""The backoff of a bounded wait (MEM-12's lease polls, a re-plan after conflicts), s."""
SCRIPTS: Final = (lua.APPLY, lua.READ, lua.HISTORY, lua.WRITE, lua.DELETE, lua.EDIT,
                  lua.RELEASE)
SHAS: Final = {src: hashlib.sha1(src.encode()).hexdigest() for src in SCRIPTS}
Command = tuple[Any, ...]


class NoScript(StoreError):
    """The server does not know a script (flushed or restarted): load it and retry."""


@dataclass(frozen=True, slots=True)
class Pipe:
    """Commands in one round trip; ``MULTI``/``EXEC`` when ``transaction``."""

    commands: tuple[Command, ...]
    transaction: bool = False


@dataclass(frozen=True, slots=True)
class Sleep:
    """Pause ``seconds`` (never blocking an event loop on the asyncio face)."""

    seconds: float


Request = Pipe | Sleep
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


def load(src: str) -> Program[None]:
    """``SCRIPT LOAD`` one script (Redis 7.0+: the scripts carry flags)."""
    _loaded((yield Pipe((("SCRIPT", "LOAD", src),)))[0])


def setup() -> Program[None]:
    """Load every script in one round trip: a store's first (fails fast when unreachable)."""
    for reply in (yield Pipe(tuple(("SCRIPT", "LOAD", src) for src in SCRIPTS))):
        _loaded(reply)


def script(src: str, keys: Sequence[bytes], args: Sequence[Any],
           extra: tuple[Command, ...] = ()) -> Program[Any]:
    """``EVALSHA`` (+ ``extra`` commands in the same round trip), loading it once on NOSCRIPT."""
    command = ("EVALSHA", SHAS[src], len(keys), *keys, *args)
    for attempt in (0, 1):
        replies = yield Pipe((command, *extra))
        if attempt == 0 and isinstance(replies[0], NoScript):
            yield from load(src)
            continue
        first_error(replies)
        return replies[0]
    raise AssertionError("unreachable")
