"""How the Redis store names its keys and encodes what it sends its scripts.

Pure functions, no I/O: the key names of a storage key (the layout is
documented in :mod:`flowmem.stores.redis_scripts`), the argument list that
carries an :class:`~flowmem.plan.AppendPlan` to the ``APPLY`` script, and the
full contents of a buffer's index keys after an administrative edit
(MEM-15), derived with :func:`flowmem.entries.derive_indexes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..entries import derive_indexes
from ..errors import InvalidStoreURL
from ..ids import declared_call_ids, is_healed
from ..messages import Message, healed_placeholder
from ..plan import AddEntry, AppendPlan, NewTurn, ReplacePlaceholder
from ..scopes import StorageKey
from .redis_scripts import BUFFER_PARTS
from .sql import encode

__all__ = ["Names", "Rewrite", "key_names", "plan_args", "rewrite", "split_url"]

URL_OPTIONS: Final = ("prefix", "lock_ttl")


def split_url(url: str) -> tuple[str, str, float]:
    """``(url for redis-py, prefix, lock_ttl)``: flowmem's own query options taken out."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in URL_OPTIONS}
    if any(k == "decode_responses" for k, _ in query):
        raise InvalidStoreURL("flowmem's Redis store reads raw bytes; drop decode_responses")
    try:
        lock_ttl = float(ours.get("lock_ttl", 1.0))
    except ValueError:
        raise InvalidStoreURL(f"lock_ttl must be seconds, in {url!r}") from None
    rest = urlunsplit(parts._replace(query=urlencode([(k, v) for k, v in query
                                                      if k not in URL_OPTIONS])))
    return rest, ours.get("prefix", "flowmem"), lock_ttl


def _escape(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogatepass")
    for char, code in ((b"%", b"%25"), (b":", b"%3A"), (b"{", b"%7B"), (b"}", b"%7D")):
        raw = raw.replace(char, code)
    return raw


class Names:
    """The keys of one storage key: its buffer keys, its scope's index, its index member."""

    __slots__ = ("body", "calls", "index", "info", "keys", "lock", "member", "meta", "pend",
                 "pos", "res", "value")

    def __init__(self, keys: tuple[bytes, ...], index: bytes, member: bytes) -> None:
        self.keys, self.index, self.member = keys, index, member
        (self.value, self.meta, self.pos, self.body, self.info, self.res, self.calls,
         self.pend, self.lock) = keys


def key_names(prefix: bytes, key: StorageKey) -> Names:
    """``{prefix:scope:scope_id:key}:part`` for every part; components percent-escaped."""
    tail = _escape(key.scope) + b":" + _escape(key.scope_id)
    base = b"{" + prefix + b":" + tail + b":" + _escape(key.key) + b"}:"
    return Names(tuple(base + part.encode() for part in BUFFER_PARTS),
                 prefix + b":idx:" + tail, key.key.encode("utf-8", "surrogatepass"))


def plan_args(plan: AppendPlan) -> list[Any]:
    """The operations of ``plan`` as the ``APPLY`` script's trailing arguments.

    ``A role body answers healed ndeclares id... nopens (id ord)...`` for an
    :class:`~flowmem.plan.AddEntry` (``answers`` is ``""`` for none: a usable
    id is never empty), ``R id body`` for a
    :class:`~flowmem.plan.ReplacePlaceholder` and ``H p|n turn count (id body)...``
    for a :class:`~flowmem.plan.HealTurn` (``n``: the turn is the ordinal-th
    entry this append adds). Bodies, placeholders included, are encoded here,
    so they are byte for byte those of the SQL stores.
    """
    args: list[Any] = []
    for op in plan.ops:
        if isinstance(op, AddEntry):
            args += ["A", op.message["role"], encode(op.message), op.answers or "",
                     int(op.healed), len(op.declares), *op.declares, len(op.opens)]
            for call, order in op.opens:
                args += [call, order]
        elif isinstance(op, ReplacePlaceholder):
            args += ["R", op.call_id, encode(op.message)]
        else:
            turn = op.turn
            ref = ["n", turn.ordinal] if isinstance(turn, NewTurn) else ["p", turn]
            args += ["H", *ref, len(op.call_ids)]
            for call in op.call_ids:
                args += [call, encode(healed_placeholder(call))]
    return args


@dataclass(frozen=True, slots=True)
class Rewrite:
    """The whole content of a buffer's keys, hash by hash (field -> value)."""

    pos: dict[str, int]
    body: dict[str, str]
    info: dict[str, str]
    res: dict[str, str]
    calls: dict[str, str]
    pend: dict[str, str]


def rewrite(entries: Sequence[tuple[int, Message]]) -> Rewrite:
    """Every key of a buffer holding ``entries`` (the MEM-15 edit path, O(length))."""
    indexes = derive_indexes(entries)
    owner = {spots[0]: call for call, spots in indexes.results.items()}  # as sql.py indexes
    info: dict[str, str] = {}
    res: dict[str, str] = {}
    for pos, message in entries:
        declared = declared_call_ids(message)
        if pos in owner:
            info[str(pos)] = "T" + owner[pos]
            res[owner[pos]] = ("h" if is_healed(message) else "") + str(pos)
        elif message["role"] == "tool":
            info[str(pos)] = "T"
        elif declared:
            info[str(pos)] = "A" + "\0".join(declared)
    return Rewrite(
        pos={str(pos): pos for pos, _ in entries},
        body={str(pos): encode(message) for pos, message in entries},
        info=info, res=res,
        calls={call: ",".join(f"{turn}:{order}" for turn, order in turns)
               for call, turns in indexes.calls.items()},
        pend={p.call_id: f"{p.turn}:{p.order}" for p in indexes.pending},
    )
