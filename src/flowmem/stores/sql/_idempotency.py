"""Idempotency records in SQL: claimed and recorded in the transaction of the change they guard."""

from __future__ import annotations

import random
from typing import Any, Final

from ...errors import IdempotencyConflict
from ...scopes import StorageKey
from ...store import Idempotency
from .._codec import decode, encode
from ._program import Batch, Program, Rows, Statement

__all__ = ["IdempotencyRecords"]

_CLAIM: Final = (
    "INSERT INTO idempotency (ikey, fingerprint, outcome, expires) VALUES (?, ?, NULL, ?) "
    "ON CONFLICT (ikey) DO UPDATE SET fingerprint = excluded.fingerprint, outcome = NULL, "
    "expires = excluded.expires WHERE idempotency.expires < ? RETURNING 1"
)
_PURGE_ONE_IN: Final = 64  # expired idempotency records are purged by one write in 64


class IdempotencyRecords:
    """The idempotency programs of :class:`~flowmem.stores.sql._conversations.SQLConversations`
    (a backend may override the statements, as PostgreSQL keys them by conversation)."""

    @staticmethod
    def claim_statements(idempotency: Idempotency,
                         key: StorageKey | None = None) -> tuple[Statement, Statement]:
        """Claim the key for this transaction, then read its record (see :meth:`claimed`).
        The claim is a row of the key's unique index: a concurrent repeat waits for this
        transaction and then replays what it recorded. ``key``: the storage key the
        operation changes (a backend may record the idempotency key with it)."""
        expires = idempotency.now + idempotency.ttl
        return ((_CLAIM, (idempotency.key, idempotency.fingerprint, expires, idempotency.now)),
                ("SELECT fingerprint, outcome FROM idempotency WHERE ikey = ?",
                 (idempotency.key,)))

    @staticmethod
    def claimed(idempotency: Idempotency, claim: Rows, record: Rows) -> dict[str, Any] | None:
        """``None`` when :meth:`claim_statements` claimed the key, else the first outcome
        recorded under it (:class:`~flowmem.errors.IdempotencyConflict` for another request)."""
        if claim:
            return None
        if record[0][0] != idempotency.fingerprint or record[0][1] is None:
            raise IdempotencyConflict(f"idempotency key {idempotency.key!r} was used for a "
                                      "different request; a retry must repeat it exactly")
        first: dict[str, Any] = decode(record[0][1])
        return first

    def claim(self, idempotency: Idempotency,
              key: StorageKey | None = None) -> Program[dict[str, Any] | None]:
        """:meth:`claim_statements` as one step; :meth:`claimed`'s answer."""
        claim, record = yield Batch(self.claim_statements(idempotency, key))
        return self.claimed(idempotency, claim, record)

    @staticmethod
    def record_statements(idempotency: Idempotency, outcome: dict[str, Any],
                          key: StorageKey | None = None) -> list[Statement]:
        """Store the outcome a repeat replays (and now and then purge expired keys)."""
        statements: list[Statement] = [("UPDATE idempotency SET outcome = ? WHERE ikey = ?",
                                         (encode(outcome), idempotency.key))]
        if random.randrange(_PURGE_ONE_IN) == 0:
            statements.append(("DELETE FROM idempotency WHERE expires < ?", (idempotency.now,)))
        return statements

    def record(self, idempotency: Idempotency, outcome: dict[str, Any],
               key: StorageKey | None = None) -> Program[None]:
        """:meth:`record_statements` as the program's last step."""
        yield Batch(tuple(self.record_statements(idempotency, outcome, key)), final=True)

