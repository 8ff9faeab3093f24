"""Erasing one identity scope id from the SQL stores, and the fence that makes it safe.

An erasure (:meth:`~flowmem.store.Store.erase`) runs as short transactions:

1. **Raise the fence**: a row of ``erasures`` naming (scope, scope id).
2. **List, then erase key by key**: each key's conversation (its messages, calls and
   buffer row) or value, and the idempotency records of the key, in one transaction
   under the key's MEM-12 lock; the listing pages on by key.
3. **Lower the fence** (delete its row).

Every statement that *creates* a key under an identity scope — an append's new
buffer, a write's value — first reads the fence in its own transaction
(:meth:`SQLErasure.fence_statements`) and raises
:class:`~flowmem.errors.ErasureInProgress` when it is up (the transaction rolls
back). An append to a conversation that already exists reads nothing more: it
either commits before the erasure's transaction for that key (and is erased
with it) or finds the conversation gone, so it creates one and meets the fence.
On SQLite writers are serialized by the database; on PostgreSQL the fence is
raised under an exclusive advisory lock on the scope id's key that each creating
transaction takes shared before it reads the fence (its own statement, so its
snapshot is taken after the lock was granted): a creation that read "no fence"
commits before the fence does, and the listing, which starts after, sees it.
"""

from __future__ import annotations

from typing import Final

from ...scopes import IDENTITY_SCOPES, StorageKey, idempotency_prefix
from ...store import Erased
from .._conflicts import erasure_refusal
from ._program import Batch, Program, Rows, Statement

__all__ = ["ERASE_PAGE", "SQLErasure", "split"]

ERASE_PAGE: Final = 100
"""Keys listed per step of an erasure (each then erased in a transaction of its own)."""


def split(answers: list[Rows], first: int) -> tuple[list[Rows], list[Rows]]:
    """The answers of a batch's ``first`` statements (the fence's), and the rest."""
    return answers[:first], answers[first:]


class SQLErasure:
    """The erasure programs of :class:`~flowmem.stores.sql._conversations.SQLConversations`
    (SQLite's statements; PostgreSQL overrides those that name a key)."""

    index_tables: tuple[str, ...]

    def buffer_id(self, key: StorageKey, *, lock: bool = False) -> Program[int | None]:
        raise NotImplementedError

    def drop_buffer(self, buffer_id: int) -> Program[None]:
        raise NotImplementedError

    # -- the fence ------------------------------------------------------------------
    def fence_statements(self, key: StorageKey) -> tuple[Statement, ...]:
        """The statements reading the fence of ``key``'s scope id, last one answering a
        row when it is up (none outside the identity scopes)."""
        if key.scope not in IDENTITY_SCOPES:
            return ()
        return (("SELECT 1 FROM erasures WHERE scope = ? AND scope_id = ?",
                 (key.scope, key.scope_id)),)

    def check_fence(self, key: StorageKey) -> Program[None]:
        """Raise :class:`ErasureInProgress` when ``key``'s scope id is fenced."""
        statements = self.fence_statements(key)
        if statements:
            self.fenced(key, (yield Batch(statements)))

    @staticmethod
    def fenced(key: StorageKey, answers: list[Rows]) -> None:
        """Raise when the fence statements' ``answers`` say the fence is up."""
        if answers and answers[-1]:
            raise erasure_refusal(key)

    def raise_fence(self, scope: str, scope_id: str) -> Program[None]:
        yield ("INSERT INTO erasures (scope, scope_id) VALUES (?, ?) ON CONFLICT DO NOTHING",
               (scope, scope_id))

    def lower_fence(self, scope: str, scope_id: str) -> Program[None]:
        yield ("DELETE FROM erasures WHERE scope = ? AND scope_id = ?", (scope, scope_id))

    # -- listing and erasing ------------------------------------------------------------
    def erasable(self, scope: str, scope_id: str, after: str,
                 limit: int = ERASE_PAGE) -> Program[list[tuple[str, bool]]]:
        """The next ``limit`` keys after ``after`` under the scope id, by key, each with
        whether it holds a conversation."""
        query = ("SELECT key, {c} FROM {t} WHERE scope = ? AND scope_id = ? AND key > ?")
        params = (scope, scope_id, after)
        rows = yield (f"{query.format(t='buffers', c=1)} UNION ALL "
                      f"{query.format(t='kv', c=0)} ORDER BY 1 LIMIT ?",
                      (*params, *params, limit))
        return [(str(key), bool(conversation)) for key, conversation in rows]

    def idempotency_statement(self, key: StorageKey, verb: str) -> Statement:
        """``verb`` (``SELECT count(*)`` or ``DELETE``) of ``key``'s idempotency records:
        SQLite finds them by the prefix every one of them starts with."""
        prefix = idempotency_prefix(key)
        return (f"{verb} FROM idempotency WHERE ikey >= ? AND ikey < ?",
                (prefix, prefix[:-1] + ";"))

    def count_messages(self, buffer_id: int) -> Statement:
        return ("SELECT count(*) FROM messages WHERE buffer_id = ?", (buffer_id,))

    def erase_key(self, key: StorageKey, dry_run: bool) -> Program[Erased]:
        """Erase (or count) one key's conversation or value and its idempotency records,
        in the caller's transaction."""
        buffer_id = yield from self.buffer_id(key, lock=True)
        messages = 0
        if buffer_id is not None:
            messages = int((yield self.count_messages(buffer_id))[0][0])
        value = yield from self.value_exists(key)
        records = int((yield self.idempotency_statement(key, "SELECT count(*)"))[0][0])
        if not dry_run:
            if buffer_id is not None:
                yield from self.drop_buffer(buffer_id)
            if value:
                yield from self.drop_value(key)
            if records:
                yield self.idempotency_statement(key, "DELETE")
        return Erased(int(buffer_id is not None), int(value), messages, records)

    def value_exists(self, key: StorageKey) -> Program[bool]:
        return bool((yield ("SELECT 1 FROM kv WHERE scope = ? AND scope_id = ? AND key = ?",
                            (key.scope, key.scope_id, key.key))))

    def drop_value(self, key: StorageKey) -> Program[bool]:
        """Delete ``key``'s value row; whether there was one."""
        return bool((yield ("DELETE FROM kv WHERE scope = ? AND scope_id = ? AND key = ? "
                            "RETURNING 1", (key.scope, key.scope_id, key.key))))
