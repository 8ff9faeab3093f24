"""PostgreSQL's variant of the shared SQL programs: every statement names the conversation key.

The shared programs (:mod:`flowmem.stores.sql._conversations`) find a
conversation by its names, (scope, scope id, key). On PostgreSQL every table
a conversation touches leads its primary key with the conversation's key
(:func:`flowmem.scopes.conversation_key`, computed here, by the client;
:mod:`flowmem.stores.postgres._schema`): ``buffers.id`` and ``kv.id`` are it,
``messages``, ``calls`` and ``idempotency`` lead with it as ``buffer_id``. So
every statement of a single-conversation operation (read, history, write,
delete, append, edit, the idempotency record) filters on that key — routable
to the one shard or partition that holds the conversation — and the
statements that find a conversation check its names too: a collision of two
keys finds nothing, and creating the second conversation (or value) raises
:class:`~flowmem.errors.StoreError`; it never shares. Key listing
(:meth:`~flowmem.stores.sql._conversations.SQLConversations.keys`) is a
fan-out over every shard.

The round trips are the shared programs': an append is two on the common
path, a read and a history page one.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Final

from ...errors import KeyConflict, StoreError
from ...messages import Message
from ...plan import BufferView, mentioned_ids
from ...scopes import IDENTITY_SCOPES, StorageKey, conversation_key
from ...store import Idempotency
from .._codec import decode, decode_all, encode
from .._modify import DELETE, KEEP, Change
from ..sql._apply import PendingInRow
from ..sql._conversations import SQLConversations
from ..sql._erasure import split
from ..sql._per_turn import per_turn_parts
from ..sql._program import Batch, Program, Statement
from ..sql._view import view_from, view_parts

__all__ = ["PostgresConversations", "fence_key", "key_of"]

_NAMED: Final = "id = ? AND scope = ? AND scope_id = ? AND key = ?"
"""A conversation's (or a value's) row: its key, its names checked."""
_BUFFER_ROW: Final = f"SELECT id, count, next_pos, pending FROM buffers WHERE {_NAMED}"
_BUFFER_ID: Final = f"SELECT id FROM buffers WHERE {_NAMED}"
_STAMPED_ROW: Final = (f"SELECT id, count, next_pos, pending, xmin::text, "
                       f"pg_current_xact_id()::xid::text FROM buffers WHERE {_NAMED} FOR UPDATE")
"""An append's row, locked, with its ``xmin`` and the transaction's own id
(:mod:`flowmem.stores.postgres._tails`)."""
_VALUE: Final = f"SELECT value FROM kv WHERE {_NAMED}"
_HAS_VALUE: Final = f"SELECT 1 FROM kv WHERE {_NAMED}"
_NEW_BUFFER: Final = ("INSERT INTO buffers (id, scope, scope_id, key) VALUES (?, ?, ?, ?) "
                      "ON CONFLICT (id) DO NOTHING")
_WRITE: Final = ("INSERT INTO kv (id, scope, scope_id, key, value) VALUES (?, ?, ?, ?, ?) "
                 "ON CONFLICT (id) DO UPDATE SET value = excluded.value "
                 "WHERE kv.scope = excluded.scope AND kv.scope_id = excluded.scope_id "
                 "AND kv.key = excluded.key RETURNING 1")
_DELETE: Final = f"DELETE FROM kv WHERE {_NAMED} RETURNING 1"
_COUNT_OR_VALUE: Final = (f"SELECT (SELECT count FROM buffers WHERE {_NAMED}), "
                          f"EXISTS (SELECT 1 FROM kv WHERE {_NAMED})")
_CLAIM: Final = (
    "INSERT INTO idempotency (buffer_id, ikey, fingerprint, outcome, expires) "
    "VALUES (?, ?, ?, NULL, ?) "
    "ON CONFLICT (buffer_id, ikey) DO UPDATE SET fingerprint = excluded.fingerprint, "
    "outcome = NULL, expires = excluded.expires WHERE idempotency.expires < ? RETURNING 1"
)
_RECORD: Final = "SELECT fingerprint, outcome FROM idempotency WHERE buffer_id = ? AND ikey = ?"
_OUTCOME: Final = "UPDATE idempotency SET outcome = ? WHERE buffer_id = ? AND ikey = ?"
_PURGE: Final = "DELETE FROM idempotency WHERE buffer_id = ? AND expires < ?"
_FENCE: Final = "SELECT 1 FROM erasures WHERE id = ? AND scope = ? AND scope_id = ?"
_PURGE_ONE_IN: Final = 64  # a conversation's expired keys are purged by one write in 64


def fence_key(scope: str, scope_id: str) -> int:
    """The key of a scope id's erasure fence (and of its advisory lock): the key of the
    storage key with an empty name, which no conversation or value has."""
    return conversation_key(StorageKey(scope, scope_id, ""))


def key_of(key: StorageKey) -> int:
    """The conversation key of ``key``: the distribution key of its rows."""
    return conversation_key(key)


def _named(key: StorageKey) -> tuple[int, str, str, str]:
    return key_of(key), key.scope, key.scope_id, key.key


def _collision(key: StorageKey, what: str) -> StoreError:
    return StoreError(f"the conversation key of {key.scope}/{key.scope_id}/{key.key!r} "
                      f"({key_of(key)}) already names another {what}'s row (a 64-bit hash "
                      "collision); nothing was stored")


class PostgresConversations(SQLConversations):
    """The shared programs, each conversation named by its key (see the module notes)."""

    buffer_row = _BUFFER_ROW
    count_or_value = _COUNT_OR_VALUE
    named = _NAMED
    value_id = "id"
    skip_locked = " FOR UPDATE SKIP LOCKED"  # a sweep never waits for an append's row

    # -- expiry (flowmem.stores.sql._expiry): rows named by their conversation key ----------
    def named_params(self, key: StorageKey) -> tuple[Any, ...]:
        return _named(key)

    def key_named(self, key: StorageKey) -> tuple[tuple[Any, ...], str, tuple[Any, ...]]:
        named = _named(key)
        return named, "?", (named[0],)

    def idempotency_of(self, key: StorageKey) -> Statement:
        return "buffer_id = ?", (key_of(key),)

    def rows_of_due(self, key: StorageKey, now: float) -> Statement:
        named = _named(key)
        return (f"buffer_id = ? AND EXISTS (SELECT 1 FROM buffers WHERE {_NAMED} "
                "AND expires_at <= ?)", (named[0], *named, now))

    def sweep_idempotency(self, keys: Sequence[StorageKey],
                          ids: Sequence[Any]) -> list[Statement]:
        return [(f"DELETE FROM idempotency WHERE buffer_id IN ({', '.join('?' * len(ids))})",
                 ids)]

    def delete_values(self, keys: Sequence[StorageKey], ids: Sequence[Any]) -> list[Statement]:
        return [(f"DELETE FROM kv WHERE id IN ({', '.join('?' * len(ids))})", ids)]

    def __init__(self) -> None:
        super().__init__(lock_row=" FOR UPDATE")

    # -- store operations ----------------------------------------------------------------
    def read(self, key: StorageKey) -> Program[tuple[bool, Any]]:
        named = _named(key)
        value, buffer, rows = yield Batch((
            (_VALUE, named), (_BUFFER_ID, named),
            self.page_statement("?", (named[0],), None, None)), final=True)
        if value:
            return True, decode(value[0][0])
        if not buffer:  # (the page is then another key's, should two keys collide)
            return False, None
        return True, decode_all(self.page_from(rows, None).encoded or [])

    def store_value(self, key: StorageKey, text: str) -> Program[None]:
        """The value row, keyed by its conversation key; the names checked (a collision
        raises)."""
        if not (yield (_WRITE, (*_named(key), text))):
            raise _collision(key, "value")

    def modify(self, key: StorageKey, change: Change) -> Program[tuple[bool, Any]]:
        """Read the value at ``key`` with its row locked, and write what ``change`` makes
        of it, in this one transaction (:mod:`flowmem.stores._modify`); what the key
        holds afterwards."""
        named = _named(key)
        rows = yield (f"{_VALUE} FOR UPDATE", named)
        found = bool(rows)
        current = decode(rows[0][0]) if found else None
        wanted = change(found, current)
        if wanted is KEEP:
            return found, current
        if wanted is DELETE:
            if found:
                yield (_DELETE, named)
            return False, None
        if not (yield (_WRITE, (*named, encode(wanted)))):
            raise _collision(key, "value")
        return True, wanted

    # -- idempotency keys: recorded with the conversation their operation changes ----------
    @staticmethod
    def claim_statements(idempotency: Idempotency,
                         key: StorageKey | None = None) -> tuple[Statement, Statement]:
        assert key is not None
        owner = key_of(key)
        expires = idempotency.now + idempotency.ttl
        return ((_CLAIM, (owner, idempotency.key, idempotency.fingerprint, expires,
                          idempotency.now)),
                (_RECORD, (owner, idempotency.key)))

    @staticmethod
    def record_statements(idempotency: Idempotency, outcome: dict[str, Any],
                          key: StorageKey | None = None) -> list[Statement]:
        assert key is not None
        owner = key_of(key)
        statements: list[Statement] = [(_OUTCOME, (encode(outcome), owner, idempotency.key))]
        if random.randrange(_PURGE_ONE_IN) == 0:
            statements.append((_PURGE, (owner, idempotency.now)))
        return statements

    # -- erasure (stores/sql/_erasure.py): the fence is keyed by its scope id's key ------
    def fence_statements(self, key: StorageKey) -> tuple[Statement, ...]:
        """The scope id's advisory lock, shared (an erasure raises the fence holding it
        exclusively), then the fence: a statement of its own, so its snapshot is taken
        once the lock was granted."""
        if key.scope not in IDENTITY_SCOPES:
            return ()
        fence = fence_key(key.scope, key.scope_id)
        return (("SELECT pg_advisory_xact_lock_shared(?)", (fence,)),
                (_FENCE, (fence, key.scope, key.scope_id)))

    def raise_fence(self, scope: str, scope_id: str) -> Program[None]:
        fence = fence_key(scope, scope_id)
        yield Batch((("SELECT pg_advisory_xact_lock(?)", (fence,)),
                     ("INSERT INTO erasures (id, scope, scope_id) VALUES (?, ?, ?) "
                      "ON CONFLICT (id) DO NOTHING", (fence, scope, scope_id))))

    def lower_fence(self, scope: str, scope_id: str) -> Program[None]:
        yield ("DELETE FROM erasures WHERE id = ? AND scope = ? AND scope_id = ?",
               (fence_key(scope, scope_id), scope, scope_id))

    def idempotency_statement(self, key: StorageKey, verb: str) -> Statement:
        return (f"{verb} FROM idempotency WHERE buffer_id = ?", (key_of(key),))

    def value_exists(self, key: StorageKey) -> Program[bool]:
        return bool((yield (_HAS_VALUE, _named(key))))

    def drop_value(self, key: StorageKey) -> Program[bool]:
        return bool((yield (_DELETE, _named(key))))

    # -- buffers ---------------------------------------------------------------------------
    def buffer_id(self, key: StorageKey, *, lock: bool = False) -> Program[int | None]:
        rows = yield (_BUFFER_ID + (self.lock_row if lock else ""), _named(key))
        return int(rows[0][0]) if rows else None

    def open_buffer(self, key: StorageKey) -> Program[tuple[int, int, int]]:
        named = _named(key)
        select = self.buffer_row + self.lock_row
        rows = yield (select, named)
        if not rows:
            fence = self.fence_statements(key)
            fenced, (value, _, rows) = split((yield Batch((
                *fence, (_HAS_VALUE, named), (_NEW_BUFFER, named), (select, named)))),
                len(fence))
            self.fenced(key, fenced)
            if value:
                raise KeyConflict(f"key {key.key!r} holds a plain value, not a conversation")
            if not rows:
                raise _collision(key, "conversation")
        return int(rows[0][0]), int(rows[0][1]), int(rows[0][2])

    def open_and_view(self, key: StorageKey,
                      incoming: Sequence[Message]) -> Program[tuple[int, int, int, BufferView]]:
        """As the shared program: the row (locked) and the view in one batch; a new
        buffer in a second, its key given (no identity column). The row's stamp goes to
        :meth:`opened`."""
        named = _named(key)
        parts, params = view_parts("?", (named[0],), sorted(mentioned_ids(incoming)))
        more, more_params = per_turn_parts("?", (named[0],), incoming)
        parts, params = parts + more, params + more_params
        view: list[Statement] = [(" UNION ALL ".join(parts), params)] if parts else []
        row, *view_rows = yield Batch(((_STAMPED_ROW, named), *view))
        if not row:  # a new buffer: refused under an erasure's fence (rolled back)
            fence = self.fence_statements(key)
            fenced, (value, _, row, *view_rows) = split((yield Batch((
                *fence, (_HAS_VALUE, named), (_NEW_BUFFER, named), (_STAMPED_ROW, named),
                *view))), len(fence))
            self.fenced(key, fenced)
            if value:
                raise KeyConflict(f"key {key.key!r} holds a plain value, not a conversation")
            if not row:
                raise _collision(key, "conversation")
        buffer_id, count, next_pos, pending, xmin, xact = row[0]
        self.opened(int(buffer_id), (xmin, int(count), int(next_pos)), xact)
        return (int(buffer_id), int(count), int(next_pos),
                view_from(view_rows[0] if view_rows else [], PendingInRow.decode(pending),
                          incoming))

    def opened(self, buffer_id: int, stamp: tuple[str, int, int], xact: str) -> None:
        """An append read its conversation's row, locked: ``stamp`` is its ``xmin``, count
        and next position, ``xact`` the append's transaction id (a hook: nothing here)."""
