"""How the Redis store names its keys and encodes what it sends its scripts.

Pure functions, no I/O: the key names of a storage key (the layout is
documented in :mod:`flowmem.stores.redis._scripts`), the argument list that
carries an :class:`~flowmem.plan.AppendPlan` to the ``APPLY`` script, and the
full contents of a buffer's index keys after an administrative edit
(MEM-15), derived with :func:`flowmem.entries.derive_indexes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from ...call_ids import caller_id
from ...entries import derive_indexes
from ...errors import InvalidStoreURL
from ...ids import declared_call_ids, is_healed
from ...messages import Message, healed_placeholder
from ...plan import AddEntry, AppendPlan, NewTurn, ReplacePlaceholder
from ...scopes import StorageKey
from .._codec import encode
from .._urls import URLOptions
from ._scripts import BUFFER_PARTS

__all__ = ["Names", "Rewrite", "StoreURL", "check_options", "glob_escaped", "idem_name",
           "key_names", "plan_args", "rewrite", "scope_pattern", "split_url"]

URL_OPTIONS: Final = ("prefix", "lock_ttl", "cluster", "node", "wait_replicas", "wait_timeout")


@dataclass(frozen=True, slots=True)
class StoreURL:
    """A store URL taken apart: the URL for redis-py and flowmem's own options.

    ``url`` names the first seed node (its query keeps redis-py's options);
    ``nodes`` every seed node, ``(host, port)``, the first included: from
    ``redis://h1:7000,h2:7001/0`` and repeated ``?node=h:p``. ``cluster`` is
    ``?cluster=yes|no`` (``None``: detect on connect); ``db`` the database index;
    ``wait_replicas`` and ``wait_timeout`` (seconds) the replicas that must confirm
    every change within that time (0: none, Redis's asynchronous replication).
    """

    url: str
    prefix: str
    lock_ttl: float
    cluster: bool | None
    nodes: tuple[tuple[str, int], ...]
    db: int
    wait_replicas: int = 0
    wait_timeout: float = 1.0


def _node(text: str, url: str) -> tuple[str, int]:
    host, _, port = text.strip().rpartition(":")
    if not host:
        host, port = port, "6379"
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        raise InvalidStoreURL(f"bad node {text!r} in {url!r}: expected host:port") from None


def split_url(url: str) -> StoreURL:
    """flowmem's own query options taken out of ``url``, the seed nodes listed."""
    options = URLOptions(url, URL_OPTIONS)
    if any(name == "decode_responses" for name, _ in options.rest):
        raise InvalidStoreURL("flowmem's Redis store reads raw bytes; drop decode_responses")
    lock_ttl = options.seconds("lock_ttl", 1.0, positive=True)
    cluster = options.boolean("cluster", None)
    userinfo, at, hosts = options.parts.netloc.rpartition("@")
    seeds = [h for h in hosts.split(",") if h]
    nodes = [_node(h, url) for h in seeds]
    nodes += [_node(v, url) for k, v in options.repeated if k == "node"]
    path = options.parts.path.strip("/") or "0"
    if not path.isdigit():
        raise InvalidStoreURL(f"the database must be a number, in {url!r}")
    if len(nodes) > 1 and cluster is False:
        raise InvalidStoreURL(f"several nodes need a cluster, in {url!r}")
    prefix = options.text("prefix", "flowmem")
    check_options(prefix, lock_ttl)
    wait_replicas = options.integer("wait_replicas", 0, 0, 1000)
    wait_timeout = options.seconds("wait_timeout", 1.0, positive=True)
    rest = options.url_for_driver(netloc=userinfo + at + (seeds[0] if seeds else ""))
    return StoreURL(rest, prefix, lock_ttl, cluster, tuple(nodes), int(path), wait_replicas,
                    wait_timeout)


def check_options(prefix: str, lock_ttl: float) -> None:
    """Refuse a prefix that could break out of the hash tag, or a lease that is no time."""
    if not prefix or "{" in prefix or "}" in prefix:
        raise InvalidStoreURL(f"prefix must be non-empty without braces, got {prefix!r}")
    if not lock_ttl > 0:
        raise InvalidStoreURL(f"lock_ttl must be positive seconds, got {lock_ttl!r}")


def _escape(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogatepass")
    for char, code in ((b"%", b"%25"), (b":", b"%3A"), (b"{", b"%7B"), (b"}", b"%7D")):
        raw = raw.replace(char, code)
    return raw


class Names:
    """The keys of one storage key: its buffer keys, its scope's index, its index member.

    ``tag`` is the hash tag all of the conversation's keys share (its idempotency
    records on a cluster too); ``index`` the scope id's key index, under a hash
    tag of its own.
    """

    __slots__ = ("body", "calls", "index", "info", "keys", "lock", "member", "meta", "pend",
                 "pos", "res", "tag", "value")

    def __init__(self, tag: bytes, keys: tuple[bytes, ...], index: bytes,
                 member: bytes) -> None:
        self.tag, self.keys, self.index, self.member = tag, keys, index, member
        (self.value, self.meta, self.pos, self.body, self.info, self.res, self.calls,
         self.pend, self.lock) = keys

    @property
    def fence(self) -> bytes:
        """The scope id's erasure fence, ``{prefix:scope:scope_id}:fence`` (the index's
        slot)."""
        return self.index[:-3] + b"fence"

    @property
    def gone(self) -> bytes:
        """The key's tombstone while it is erased on a cluster, ``{…}:gone``."""
        return self.tag + b":gone"


def key_names(prefix: bytes, key: StorageKey) -> Names:
    """``{prefix:scope:scope_id:key}:part`` for every part, ``{prefix:scope:scope_id}:idx``
    for the index; components percent-escaped."""
    tail = prefix + b":" + _escape(key.scope) + b":" + _escape(key.scope_id)
    tag = b"{" + tail + b":" + _escape(key.key) + b"}"
    return Names(tag, tuple(tag + b":" + part.encode() for part in BUFFER_PARTS),
                 b"{" + tail + b"}:idx", key.key.encode("utf-8", "surrogatepass"))


def idem_name(names: Names, idem_key: str) -> bytes:
    """An idempotency record's key, ``{…}:idem:KEY``: in the conversation's own slot
    (the coordinator scopes every key to the storage key it names)."""
    return names.tag + b":idem:" + _escape(idem_key)


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
            if caller_id(owner[pos]) != owner[pos]:  # the newest alias (._per_turn_lua)
                res[caller_id(owner[pos]) + "\0"] = owner[pos]
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


def glob_escaped(raw: bytes) -> bytes:
    """``raw`` matched literally by a ``SCAN MATCH`` pattern."""
    for char in (b"\\", b"*", b"?", b"[", b"]"):
        raw = raw.replace(char, b"\\" + char)
    return raw


def scope_pattern(prefix: bytes, scope: str, scope_id: str) -> bytes:
    """The ``SCAN MATCH`` pattern of every key of every storage key under one scope id:
    its buffers' parts, idempotency records and tombstones (not its index or fence)."""
    return glob_escaped(b"{" + prefix + b":" + _escape(scope) + b":" + _escape(scope_id)
                        + b":") + b"*"
