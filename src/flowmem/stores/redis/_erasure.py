"""Erasing one identity scope id from Redis, and the fence that makes it safe.

An erasure (:meth:`~flowmem.store.Store.erase`) as a program of small steps:

1. **Raise the fence**: ``{P:scope:scope_id}:fence``, in the slot of the scope
   id's key index.
2. **List, then erase key by key**: for each key of the index, the ``ERASE``
   script deletes its parts in its own slot (one atomic step) and, on a
   cluster, leaves a tombstone there (``{…}:gone``); then the key is unlisted.
3. **Sweep**: one ``SCAN`` (every node of a cluster) for the scope id's key
   pattern finds what no listing names — idempotency records, and on a cluster
   a conversation whose creation was not listed — and deletes it.
4. **Lower the fence**, then (a cluster) take the tombstones away.

What refuses a racing append or write: the scripts that may *create* a key
check one more key, ``KEYS[12]``, only when they would create it (a common
append to an existing conversation checks nothing more). On a standalone
server that key is the fence itself (any key may be read there) and the
listing is part of the same script, so a creation either commits before the
fence (and is listed, then erased) or is refused. On a cluster the fence
lives in another slot than the conversation, so it is checked where the
listing happens — the ``LIST`` script every creation goes through first
(an append that thinks the key listed is told by ``APPLY`` to list it again
before it may create it) — and the tombstone, in the conversation's own
slot, refuses an append that listed the key before the fence and reaches
``APPLY`` after the key was erased.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from ...scopes import StorageKey
from ...store import Erased
from . import _scripts as lua
from ._keys import scope_pattern
from ._requests import Pipe, Program, Scan, first_error, script

if TYPE_CHECKING:
    from ._programs import RedisPrograms

__all__ = ["erase"]

_PAGE: Final = 100
_PARTS: Final = tuple(b":" + part.encode() for part in lua.BUFFER_PARTS)


def erase(programs: RedisPrograms, scope: str, scope_id: str, *,
          dry_run: bool) -> Program[Erased]:
    """The erasure program (module notes)."""
    scope_names = programs.names(StorageKey(scope, scope_id, ""))
    index, fence = scope_names.index, scope_names.fence
    tombstones = programs.cluster and not dry_run
    if not dry_run:
        first_error((yield Pipe((("SET", fence, b"1"),))))
    total, seen, gone = Erased(), set[bytes](), list[bytes]()
    low = b"-"
    while True:
        batch = (yield Pipe((("ZRANGEBYLEX", index, low, b"+", "LIMIT", 0, _PAGE),)))[0]
        first_error([batch])
        if not batch:
            break
        for member in batch:
            names = programs.names(StorageKey(scope, scope_id,
                                              member.decode("utf-8", "surrogatepass")))
            total += yield from _erase_tag(programs, names.tag, dry_run, tombstones)
            seen.add(names.tag)
            gone.append(names.gone)
        if not dry_run:
            first_error((yield Pipe((("ZREM", index, *batch),))))
        low = b"(" + batch[-1]
    total += yield from _sweep(programs, scope, scope_id, seen, gone, dry_run, tombstones)
    if not dry_run:
        first_error((yield Pipe((("DEL", fence),))))
        if tombstones:
            yield from _delete(gone)
    return total


def _sweep(programs: RedisPrograms, scope: str, scope_id: str, seen: set[bytes],
           gone: list[bytes], dry_run: bool, tombstones: bool) -> Program[Erased]:
    """Idempotency records, and conversations no listing names (a cluster's creation whose
    listing failed): found by ``SCAN``, deleted."""
    found: list[bytes] = yield Scan(scope_pattern(programs.prefix, scope, scope_id))
    records = [name for name in found if b"}:idem:" in name]
    total = Erased(idempotency_records=len(records))
    for tag in sorted({name[:name.index(b"}") + 1] for name in found} - seen):
        if any(name.startswith(tag) and name[len(tag):] in _PARTS for name in found):
            total += yield from _erase_tag(programs, tag, dry_run, tombstones)
            gone.append(tag + b":gone")
    if not dry_run:
        yield from _delete(records)
    return total


def _erase_tag(programs: RedisPrograms, tag: bytes, dry_run: bool,
               tombstone: bool) -> Program[Erased]:
    """The ``ERASE`` script on one key (confirmed by replicas when asked, unless a dry run)."""
    keys = (*(tag + part for part in _PARTS), tag + b":gone")
    conversation, value, messages = yield from script(
        lua.ERASE, keys, (b"1" if dry_run else b"", b"1" if tombstone else b""),
        None if dry_run else programs.confirm)
    return Erased(int(conversation), int(value), int(messages) if conversation else 0)


def _delete(names: Sequence[bytes]) -> Program[None]:
    for start in range(0, len(names), _PAGE):  # one key a command: a cluster routes each
        first_error((yield Pipe(tuple(("DEL", name) for name in names[start:start + _PAGE]))))
