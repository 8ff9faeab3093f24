"""Expiry in SQL, shared by the SQLite and PostgreSQL stores (sans-I/O programs).

A conversation's row (``buffers``) and a value's row (``kv``) carry
``expires_at`` (seconds since the epoch; ``NULL``: kept), indexed for the
sweep. What is set and when it has passed is decided by :mod:`flowmem.retention`
and handed down as an :class:`~flowmem.retention.Expiry` or a ``now``; here
those decisions are only executed:

* a read, history or key listing at ``now`` sees an expired row as absent
  (one more statement in the read's own batch: :meth:`SQLExpiry.live_only`);
* an append or write at ``expiry.now`` first drops the key's expired data
  (:meth:`SQLExpiry.purge_statements`: indexed statements in the operation's
  first batch, no round trip of their own), then sets ``expires_at`` in its
  last batch;
* :meth:`SQLExpiry.sweep` deletes up to ``batch`` expired conversations and
  values, and their idempotency records, in one short transaction, by set
  statements (on PostgreSQL the rows are taken ``FOR UPDATE SKIP LOCKED``: an
  append holding one is never waited for, it is left to the next sweep).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from ...retention import Expiry, Swept
from ...scopes import StorageKey, idempotency_prefix
from ._program import Batch, Program, Rows, Statement, T, resumed

__all__ = ["SQLExpiry"]

_NAMES: Final = "scope = ? AND scope_id = ? AND key = ?"


def _marks(count: int) -> str:
    return ", ".join("?" * count)


class SQLExpiry:
    """The expiry programs of :class:`~flowmem.stores.sql._conversations.SQLConversations`
    (PostgreSQL names a key by its conversation key too, and keeps idempotency records by
    it: it overrides :attr:`named`, :meth:`named_params` and the idempotency parts)."""

    named: str = _NAMES
    """The SQL naming one key's row in ``buffers`` or ``kv``."""
    skip_locked: str = ""
    """What the sweep's selection adds to leave rows other transactions hold."""
    index_tables: tuple[str, ...] = ("messages", "calls")
    value_id: str = "NULL"
    """What a value's row is deleted by in a sweep (SQLite's ``kv`` has no id: its names)."""

    def named_params(self, key: StorageKey) -> tuple[Any, ...]:
        return key.scope, key.scope_id, key.key

    def idempotency_of(self, key: StorageKey) -> Statement:
        """The condition (and its parameters) naming every idempotency record of ``key``."""
        prefix = idempotency_prefix(key)
        return "ikey >= ? AND ikey < ?", (prefix, prefix[:-1] + ";")  # ';' follows ':'

    def sweep_idempotency(self, keys: Sequence[StorageKey],
                          ids: Sequence[Any]) -> list[Statement]:
        """Delete the idempotency records of swept ``keys`` (``ids``: their rows' ids)."""
        statements = []
        for key in keys:
            where, params = self.idempotency_of(key)
            statements.append((f"DELETE FROM idempotency WHERE {where}", params))
        return statements

    def delete_values(self, keys: Sequence[StorageKey], ids: Sequence[Any]) -> list[Statement]:
        """Delete swept values' rows (``ids``: what :attr:`value_id` selected)."""
        return [(f"DELETE FROM kv WHERE {self.named}", self.named_params(key)) for key in keys]

    def rows_of_due(self, key: StorageKey, now: float) -> Statement:
        """The condition naming the message and call rows of ``key``'s conversation when it
        expired by ``now`` (nothing otherwise)."""
        return (f"buffer_id = (SELECT id FROM buffers WHERE {self.named} AND expires_at <= ?)",
                (*self.named_params(key), now))

    # -- reads: expired is absent -------------------------------------------------------
    def expired_check(self, key: StorageKey, now: float) -> Statement:
        """One row per expired row of ``key`` (none: live or absent)."""
        params = self.named_params(key)
        return (f"SELECT 1 FROM buffers WHERE {self.named} AND expires_at <= ? UNION ALL "
                f"SELECT 1 FROM kv WHERE {self.named} AND expires_at <= ?",
                (*params, now, *params, now))

    def live_only(self, program: Program[T], key: StorageKey, now: float | None,
                  absent: T) -> Program[T]:
        """``program``, with the check of ``key``'s expiry sent in its first step; when
        the key expired by ``now`` the answer is ``absent`` (``now=None``: no check)."""
        if now is None:
            return (yield from program)
        step = next(program)
        steps = step.statements if isinstance(step, Batch) else (step,)
        final = isinstance(step, Batch) and step.final
        found, *answers = yield Batch((self.expired_check(key, now), *steps), final=final)
        if found:
            program.close()
            return absent
        return (yield from resumed(program, answers if isinstance(step, Batch) else answers[0]))

    def keys_filter(self, now: float | None) -> tuple[str, tuple[float, ...]]:
        """What a key listing adds to see only live keys."""
        if now is None:
            return "", ()
        return "AND (expires_at IS NULL OR expires_at > ?) ", (now,)

    # -- writes: drop what expired, then set the expiry -------------------------------
    def purge_statements(self, key: StorageKey, now: float) -> list[Statement]:
        """Drop ``key``'s data and its idempotency records when expired by ``now`` (indexed
        statements that change nothing otherwise)."""
        params = self.named_params(key)
        due_buffer = f"SELECT id FROM buffers WHERE {self.named} AND expires_at <= ?"
        due_value = f"SELECT 1 FROM kv WHERE {self.named} AND expires_at <= ?"
        idem, idem_params = self.idempotency_of(key)
        rows, rows_params = self.rows_of_due(key, now)
        statements: list[Statement] = [
            (f"DELETE FROM idempotency WHERE {idem} AND (EXISTS ({due_buffer}) "
             f"OR EXISTS ({due_value}))", (*idem_params, *params, now, *params, now))]
        statements += [(f"DELETE FROM {table} WHERE {rows}", rows_params)
                       for table in self.index_tables]
        statements += [(f"DELETE FROM buffers WHERE {self.named} AND expires_at <= ? "
                        "RETURNING 1", (*params, now)),
                       (f"DELETE FROM kv WHERE {self.named} AND expires_at <= ?", (*params, now))]
        return statements

    @staticmethod
    def buffer_expiry(buffer_id: int, expiry: Expiry) -> Statement:
        """Set a conversation's ``expires_at`` (idle: always; absolute: when unset)."""
        unset = "" if expiry.renew else " AND expires_at IS NULL"  # absolute: set once
        return f"UPDATE buffers SET expires_at = ? WHERE id = ?{unset}", (expiry.at, buffer_id)

    def value_expiry(self, key: StorageKey, expiry: Expiry) -> Statement:
        """Set a value's ``expires_at`` (as :meth:`buffer_expiry`)."""
        unset = "" if expiry.renew else " AND expires_at IS NULL"
        return (f"UPDATE kv SET expires_at = ? WHERE {self.named}{unset}",
                (expiry.at, *self.named_params(key)))

    def touch(self, key: StorageKey, expiry: Expiry) -> Program[bool]:
        """Move a live key's expiry (``refresh_on_read``); whether it was there."""
        params = self.named_params(key)
        live = "AND (expires_at IS NULL OR expires_at > ?) RETURNING 1"
        buffer, value = yield Batch((
            (f"UPDATE buffers SET expires_at = ? WHERE {self.named} {live}",
             (expiry.at, *params, expiry.now)),
            (f"UPDATE kv SET expires_at = ? WHERE {self.named} {live}",
             (expiry.at, *params, expiry.now))), final=True)
        return bool(buffer or value)

    # -- the sweep --------------------------------------------------------------------
    def sweep(self, now: float, batch: int) -> Program[Swept]:
        """Delete up to ``batch`` expired conversations and values (one transaction)."""
        due = (f"SELECT {{i}}, scope, scope_id, key FROM {{t}} WHERE expires_at <= ? "
               f"ORDER BY expires_at LIMIT ?{self.skip_locked}")
        buffers: Rows = yield (due.format(i="id", t="buffers"), (now, batch))
        values: Rows = []
        if len(buffers) < batch:
            values = yield (due.format(i=self.value_id, t="kv"), (now, batch - len(buffers)))
        counts: dict[str, int] = {}
        statements: list[Statement] = []
        for rows, table in ((buffers, "buffers"), (values, "kv")):
            if not rows:
                continue
            ids = [row[0] for row in rows]
            keys = [StorageKey(row[1], row[2], row[3]) for row in rows]
            statements += self.sweep_idempotency(keys, ids)
            if table == "buffers":
                statements += [(f"DELETE FROM {name} WHERE {column} IN ({_marks(len(ids))})", ids)
                               for name, column in (*((index, "buffer_id")
                                                      for index in self.index_tables),
                                                    ("buffers", "id"))]
            else:
                statements += self.delete_values(keys, ids)
            for key in keys:
                counts[key.scope] = counts.get(key.scope, 0) + 1
        if statements:
            yield Batch(tuple(statements), final=True)
        return Swept(counts, done=len(buffers) + len(values) < batch)
