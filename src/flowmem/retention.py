"""Retention policies: when a conversation or value expires (pure, no I/O).

A :class:`Retention` maps a scope to a :class:`Policy`. A policy is either
*idle* (the data expires ``seconds`` after its last append or write; a read
moves it too only with ``refresh_on_read``) or *absolute* (it expires
``seconds`` after it was created, whatever happens to it since). This module
is the ONE place both are decided: :meth:`Retention.expiry` tells a store what
to set on a write, :func:`expired` whether a stored instant has passed.
Instants are seconds since the epoch from the coordinator's ``clock`` (tests
inject one and never sleep).

Spellings (:func:`parse_retention`): a mapping ``{"session": "30d", "user":
3600}`` or a command-line text ``"session=30d,user=max_age:365d"``; a duration
is a positive number of seconds or a text ``45s``, ``15m``, ``12h``, ``30d``
(and ``2w``); a policy is a duration (idle), ``max_age:<duration>``
(absolute) or a :class:`Policy`. Anything else raises
:class:`InvalidRetention` and changes nothing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from .errors import InvalidInput
from .scopes import SCOPES

__all__ = ["Expiry", "InvalidRetention", "Policy", "Retention", "Swept", "check_retention",
           "expired",
           "parse_duration", "parse_retention"]

_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION: Final = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*")
MAX_SECONDS: Final = 100 * 365 * 86400.0
"""The longest retention accepted (a century): every backend stores the instant exactly."""


class InvalidRetention(InvalidInput):
    """A retention policy or duration flowmem cannot use; nothing was changed."""


class Expiry(NamedTuple):
    """What a store is told on an append or write under a policy.

    ``now``: the coordinator's clock; ``at``: the instant the data expires;
    ``renew``: ``True`` for an idle policy (every write sets ``at``), ``False``
    for an absolute one (``at`` is set when the data is created and kept).
    Data whose stored instant is at or before ``now`` is expired: the write
    starts afresh (the old data is dropped in the same atomic unit).
    """

    now: float
    at: float
    renew: bool


@dataclass(frozen=True, slots=True)
class Policy:
    """How long a scope's data lives: ``seconds`` idle, or since creation (``absolute``)."""

    seconds: float
    absolute: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "seconds", parse_duration(self.seconds))
        if not isinstance(self.absolute, bool):
            raise InvalidRetention(f"absolute must be True or False, got {self.absolute!r}")

    def __str__(self) -> str:
        return ("max_age:" if self.absolute else "") + format_duration(self.seconds)


@dataclass(frozen=True, slots=True)
class Retention:
    """A :class:`Policy` per scope; scopes without one keep their data.

    ``refresh_on_read``: a read or history of a conversation or value under
    an idle policy moves its expiry as a write does (one more store call).
    """

    policies: Mapping[str, Policy] = field(default_factory=dict)
    refresh_on_read: bool = False

    def expiry(self, scope: str, now: float) -> Expiry | None:
        """What a write at ``now`` sets in ``scope`` (``None``: the scope keeps its data)."""
        policy = self.policies.get(scope)
        if policy is None:
            return None
        return Expiry(now, now + policy.seconds, not policy.absolute)

    def refresh(self, scope: str, now: float) -> Expiry | None:
        """What a read at ``now`` sets: an idle policy's expiry when asked, else ``None``."""
        if not self.refresh_on_read:
            return None
        expiry = self.expiry(scope, now)
        return expiry if expiry is not None and expiry.renew else None

    def __str__(self) -> str:
        return ",".join(f"{scope}={policy}" for scope, policy in sorted(self.policies.items()))


@dataclass(frozen=True, slots=True)
class Swept:
    """What a sweep removed: expired conversations and values by scope, and ``done``
    (``True`` when nothing expired was left for this sweep's instant)."""

    by_scope: dict[str, int] = field(default_factory=dict)
    done: bool = True

    @property
    def total(self) -> int:
        return sum(self.by_scope.values())

    def plus(self, other: Swept) -> Swept:
        merged = dict(self.by_scope)
        for scope, count in other.by_scope.items():
            merged[scope] = merged.get(scope, 0) + count
        return Swept(merged, other.done)


def check_retention(store: object, retention: Retention | None) -> None:
    """Refuse a policy over a store that cannot keep it (one without ``sweep``)."""
    if retention is not None and not callable(getattr(store, "sweep", None)):
        raise InvalidRetention(f"the {type(store).__name__} store keeps no expiry: retention "
                               f"needs the memory, SQLite, PostgreSQL or Redis store")


def expired(expires_at: float | None, now: float) -> bool:
    """Whether data stored with ``expires_at`` (``None``: never) is expired at ``now``."""
    return expires_at is not None and expires_at <= now


def parse_duration(value: Any) -> float:
    """Seconds from a positive number or a text like ``45s``, ``15m``, ``12h``, ``30d``, ``2w``."""
    seconds: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.fullmatch(value)):
        seconds = float(match[1]) * _UNITS[match[2] or "s"]
    if seconds is None or not math.isfinite(seconds) or not 0 < seconds <= MAX_SECONDS:
        raise InvalidRetention(f"a retention is a positive number of seconds or a duration "
                               f"like 45s, 15m, 12h, 30d (at most 100 years), got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """The shortest exact text of ``seconds`` (``86400`` -> ``1d``)."""
    for unit in ("w", "d", "h", "m"):
        if seconds % _UNITS[unit] == 0:
            return f"{int(seconds // _UNITS[unit])}{unit}"
    return f"{seconds:g}s"


def _policy(scope: Any, value: Any) -> Policy:
    if not isinstance(scope, str) or scope not in SCOPES:
        raise InvalidRetention(f"retention names a scope ({', '.join(SCOPES)}), got {scope!r}")
    if isinstance(value, Policy):
        return value
    if isinstance(value, str) and value.strip().startswith("max_age:"):
        return Policy(parse_duration(value.strip()[len("max_age:"):]), absolute=True)
    return Policy(parse_duration(value))


def parse_retention(spec: Any, *, refresh_on_read: bool = False) -> Retention | None:
    """A :class:`Retention` from a mapping, a ``scope=duration,...`` text, or one already
    made (``None`` or empty: no retention)."""
    if not isinstance(refresh_on_read, bool):
        raise InvalidRetention(f"refresh_on_read must be True or False, got {refresh_on_read!r}")
    if spec is None:
        return None
    if isinstance(spec, Retention):
        return spec
    if isinstance(spec, str):
        pairs: list[tuple[str, str]] = []
        for item in filter(None, (part.strip() for part in spec.split(","))):
            scope, equals, value = item.partition("=")
            if not equals:
                raise InvalidRetention(f"retention items are scope=duration, got {item!r}")
            pairs.append((scope.strip(), value.strip()))
        spec = dict(pairs)
    if not isinstance(spec, Mapping):
        raise InvalidRetention(f"retention is a mapping of scope to duration, got {spec!r}")
    policies = {scope: _policy(scope, value) for scope, value in spec.items()}
    return Retention(policies, refresh_on_read) if policies else None
