"""What a Redis store remembers of its conversations' planner views: a guess, never trusted.

An append plans (:func:`flowmem.plan.plan_append`) against a view of the
buffer: for each id its messages mention, whether the buffer holds a result
for it (and whether that result is a healed placeholder) and whether a turn
declares it; and, when the append heals (MEM-3), every unanswered call. The
store does not read that view before planning. It *guesses* it from what its
own earlier appends learned (:class:`ViewCache`), plans against the guess and
sends the plan and the guess to the ``APPLY`` script in ONE round trip. The
script applies the plan only if the buffer still matches the guess, field for
field; otherwise it changes nothing and replies with the true view, and the
store plans again (a second round trip). Since the plan reads nothing but the
view, a plan made against a guess the script confirmed is the plan a fresh
read would have given: a stale or wrong guess costs a round trip, never a
duplicate, a lost or a misplaced message. Another writer appending to the
same conversation invalidates a guess only where it touched the ids this
append mentions, or the unanswered calls when this append heals.

Bounds: :data:`CACHED_BUFFERS` conversations per store (least recently
appended forgotten first); per conversation at most :data:`CACHED_IDS` ids
and :data:`CACHED_PENDING` unanswered calls, each id at most
:data:`MAX_ID_CHARS` characters (longer ids are not remembered). Measured
with ``tracemalloc``: a full cache (1024 conversations × 64 ids and 64
unanswered calls, 30-character ids) holds 16 MB, about 15 KB a conversation;
with 128-character ids at most about twice that. What is forgotten is
guessed absent (or, for the unanswered calls, none). So is a conversation whose
expiry instant (retention), as its last append left it, has passed by the
append's clock: the script drops it before applying the plan.
"""

from __future__ import annotations

import hashlib
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from ...messages import Message
from ...plan import BufferView, PendingCall
from .._codec import decode

__all__ = ["ABSENT", "CACHED_BUFFERS", "CACHED_IDS", "CACHED_PENDING", "MAX_ID_CHARS", "Facts",
           "Guess", "ViewCache"]

CACHED_BUFFERS: Final = 1024
CACHED_IDS: Final = 64
CACHED_PENDING: Final = 64
MAX_ID_CHARS: Final = 128
ABSENT: Final = "--"
"""An id's code: its result ``-`` none, ``h`` healed placeholder, ``r`` real; then ``d``
when a turn declares it, else ``-`` (as the ``APPLY`` script spells it)."""
_CODES: Final = {c.encode(): c for c in (r + d for r in "-hr" for d in "-d")}


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogatepass")


@dataclass(frozen=True, slots=True)
class Facts:
    """The ``per_turn`` facts an append plans against (:mod:`._per_turn_lua`), by the
    caller's id: ``newest`` the stored id of its newest declaration with a result
    (``""``: none); ``firsts`` the position and body of its first declaring turn
    (``("", b"")``: none). Never remembered across appends: guessed none (a fresh id's
    truth), read from the script when it says otherwise."""

    newest: dict[str, str]
    firsts: dict[str, tuple[str, bytes]]

    @classmethod
    def none(cls, answered: set[str], declared: set[str]) -> Facts:
        """No declaration of any of the ids: what holds for ids never used before."""
        return cls(dict.fromkeys(sorted(answered), ""),
                   dict.fromkeys(sorted(declared), ("", b"")))

    def view(self) -> tuple[dict[str, str], dict[str, Message]]:
        """``newest`` and ``firsts`` as :class:`~flowmem.plan.BufferView` takes them."""
        return ({call: stored for call, stored in self.newest.items() if stored},
                {call: decode(_text(body)) for call, (pos, body) in self.firsts.items()
                 if pos})

    def args(self) -> list[Any]:
        """The ``APPLY`` arguments that carry the facts for the script to check."""
        out: list[Any] = [len(self.newest)]
        for call, stored in self.newest.items():
            out += [call, stored]
        out.append(len(self.firsts))
        for call, (pos, body) in self.firsts.items():
            out += [call, pos, hashlib.sha1(body).hexdigest() if pos else ""]
        return out

    def corrected(self, flat: Sequence[Any]) -> tuple[Facts, dict[str, str]]:
        """The facts of a ``conflict`` reply, and the code of each newest stored id."""
        newest: dict[str, str] = {}
        codes: dict[str, str] = {}
        for k, call in enumerate(self.newest):
            stored = newest[call] = _text(flat[2 * k])
            if stored:
                codes[stored] = _CODES[flat[2 * k + 1]]
        base = 2 * len(self.newest)
        firsts = {call: (_text(flat[base + 2 * k]), bytes(flat[base + 2 * k + 1]))
                  for k, call in enumerate(self.firsts)}
        return Facts(newest, firsts), codes


@dataclass(frozen=True, slots=True)
class Guess:
    """The view an append plans against and the script checks.

    ``codes[k]`` is the code of ``ids[k]``; ``pending`` maps each unanswered
    call to ``"turn:order"`` (``None``: the append does not heal, so the plan
    does not read them); ``listed``: the conversation is known to be in its
    scope's key index already; ``facts``: those of a ``per_turn`` append, else ``None``.
    """

    ids: tuple[str, ...]
    codes: tuple[str, ...]
    pending: dict[str, str] | None
    listed: bool
    facts: Facts | None = None

    def view(self) -> BufferView:
        """The guess as the planner reads it."""
        results = {i: c[0] == "h" for i, c in zip(self.ids, self.codes, strict=True)
                   if c[0] != "-"}
        declared = {i for i, c in zip(self.ids, self.codes, strict=True) if c[1] == "d"}
        pending: list[PendingCall] = []
        for call, where in (self.pending or {}).items():
            turn, order = where.split(":")
            pending.append(PendingCall(call, int(turn), int(order)))
        if self.facts is None:
            return BufferView(results, declared, pending)
        return BufferView(results, declared, pending, *self.facts.view())

    def args(self) -> list[Any]:
        """The ``APPLY`` arguments that carry the guess for the script to check."""
        out: list[Any] = [len(self.ids)]
        for call, code in zip(self.ids, self.codes, strict=True):
            out += [call, code]
        if self.pending is None:
            out.append("*")
        else:
            out.append(len(self.pending))
            for call, where in self.pending.items():
                out += [call, where]
        return out + (["*"] if self.facts is None else self.facts.args())

    def corrected(self, reply: Sequence[Any]) -> Guess:
        """The true view from a ``conflict`` reply: the ids' codes (+ the unanswered calls)."""
        codes = tuple(_CODES[c] for c in reply[1:1 + len(self.ids)])
        at = 1 + len(self.ids)
        pending = None
        if self.pending is not None:
            flat = reply[at]
            pending = {_text(flat[k]): _text(flat[k + 1]) for k in range(0, len(flat), 2)}
            at += 1
        if self.facts is None:
            return Guess(self.ids, codes, pending, self.listed)
        facts, newest = self.facts.corrected(reply[at])
        extra = tuple(stored for stored in newest if stored not in self.ids)
        return Guess(self.ids + extra, codes + tuple(newest[s] for s in extra), pending,
                     self.listed, facts)


class _Known:
    """One conversation as this store last saw it."""

    __slots__ = ("codes", "due", "listed", "pending")

    def __init__(self) -> None:
        self.codes: OrderedDict[str, str] = OrderedDict()  # ids not ABSENT, oldest first
        self.pending: dict[str, str] = {}
        self.listed = False
        self.due: int | None = None  # its expiry instant (ms), None: kept

    def note(self, call: str, code: str) -> None:
        if code == ABSENT or len(call) > MAX_ID_CHARS:
            self.codes.pop(call, None)
            return
        self.codes[call] = code
        self.codes.move_to_end(call)
        if len(self.codes) > CACHED_IDS:
            self.codes.popitem(last=False)


_caches: weakref.WeakSet[ViewCache] = weakref.WeakSet()


def _fresh_mutexes() -> None:
    # a mutex held by another thread of the parent at fork() would stay held in the child
    for cache in list(_caches):
        cache._mutex = threading.Lock()


os.register_at_fork(after_in_child=_fresh_mutexes)


class ViewCache:
    """An LRU of :data:`CACHED_BUFFERS` conversations' last known views (thread-safe)."""

    def __init__(self, buffers: int = CACHED_BUFFERS) -> None:
        self.buffers = buffers
        self._known: OrderedDict[bytes, _Known] = OrderedDict()
        self._mutex = threading.Lock()
        _caches.add(self)

    def guess(self, buffer: bytes, ids: Sequence[str], heals: bool,
              now: int | str | None = None) -> Guess:
        """The view to plan against: what is known of ``ids`` (else absent), and the
        unanswered calls when the append ``heals``; all absent when the conversation
        expired by ``now`` (ms, retention) as far as this store knows."""
        with self._mutex:
            known = self._known.get(buffer)
            if known is not None and known.due is not None and isinstance(now, int) \
                    and known.due <= now:
                del self._known[buffer]
                known = None
            if known is None:
                return Guess(tuple(ids), (ABSENT,) * len(ids), {} if heals else None, False)
            codes = tuple(known.codes.get(call, ABSENT) for call in ids)
            return Guess(tuple(ids), codes, dict(known.pending) if heals else None,
                         known.listed)

    def learn(self, buffer: bytes, guess: Guess, touched: Sequence[Any], *,
              listed: bool = True, due: int | None = None) -> None:
        """After an append the script applied: ``guess`` held, ``touched`` (flat
        ``id code pending-entry`` triples) is how the ids it touched are now, ``due``
        the conversation's expiry instant (ms; ``None``: kept)."""
        with self._mutex:
            known = self._known.pop(buffer, None) or _Known()
            self._known[buffer] = known  # the most recently used, last
            for call, code in zip(guess.ids, guess.codes, strict=True):
                known.note(call, code)
            if guess.pending is not None:
                known.pending = dict(guess.pending)
            for k in range(0, len(touched), 3):
                call, where = _text(touched[k]), touched[k + 2]
                known.note(call, _CODES[touched[k + 1]])
                if where:
                    known.pending[call] = _text(where)
                else:
                    known.pending.pop(call, None)
            if len(known.pending) > CACHED_PENDING or any(
                    len(call) > MAX_ID_CHARS for call in known.pending):
                known.pending = {}  # not carried: a heal will be corrected by the script
            known.listed = listed
            known.due = due
            while len(self._known) > self.buffers:
                self._known.popitem(last=False)

    def forget(self, buffer: bytes) -> None:
        """Drop what is known of ``buffer`` (it holds a plain value now)."""
        with self._mutex:
            self._known.pop(buffer, None)
