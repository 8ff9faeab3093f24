"""Server-side prepared statements for the PostgreSQL stores' round trips, sans I/O.

Both faces send every round trip as ONE simple-protocol query string
(:func:`~flowmem.stores.postgres._common.query`). This module rewrites the
statements of a round trip before they are bound and sent, and learns from
the answer what the session now holds; the faces only do the I/O.

The rules (URL option ``prepared``, default on; :class:`Switch`):

- a statement with parameters whose text this connection has sent before
  (:data:`THRESHOLD` times in all) is sent as ``EXECUTE name(<values>)``;
  the first time, ``PREPARE name AS <text with $1..$k>`` goes just before it,
  in the same query string — unless the round trip's text values are
  :data:`LARGE` (PostgreSQL keeps a ``PREPARE``'s whole query string).
  Statements with no parameters — ``BEGIN``, the settings, the MEM-12 lock,
  ``COMMIT``, a round trip of only such statements — are sent as they are.
  The values are bound as before (:mod:`flowmem.stores.postgres._binding`):
  the quoting does not change;
- the cache (:class:`Statements`) belongs to ONE physical connection (an
  attribute of the connection object): a new or replaced connection starts
  empty, a connection thrown away takes its cache along. It holds at most
  :data:`CAPACITY` statements, least recently used out first, each evicted one
  ``DEALLOCATE``\\ d at the head of the next round trip that carries statements
  with parameters;
- a name is ``fm_<16 random hex digits>_<serial>``, never reused: a name
  always means the one text it was prepared with, so a session that holds
  another client's statements (a transaction-pooling proxy) can only make an
  ``EXECUTE`` fail, never run a different statement;
- what the session holds is learnt from the answer: the statements before the
  first error ran, the ones after it did not (a query string stops at its
  first error). When no answer came (a cancellation, a lost connection) a
  ``PREPARE`` in flight counts as not run and a ``DEALLOCATE`` as run: at worst
  an unused statement is left in the session, never a name used that is not;
- an error AT one of these statements is this layer's, not the program's
  (:class:`Replay`; the faces then run the transaction once more, without it):
  SQLSTATE 26000 (no such prepared statement) or 42P05 (already exists) means
  the session's statements are not what this client thinks — a
  transaction-pooling proxy such as pgbouncer ``pool_mode = transaction``
  handed the transaction to another server connection — and turns prepared
  statements OFF for the store for good (one warning on the ``flowmem``
  logger); 42P18/42P08/42725 at a ``PREPARE`` (PostgreSQL could not infer a
  parameter's type without the values) marks that text as never prepared by
  this store. Nothing of the failed transaction was committed: every
  transaction starts with ``BEGIN``, the error aborts it, and the rest of the
  query string — a ``COMMIT`` in it included — is not run.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Final

from ...errors import MissingDependency, StoreError

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg.pq import ExecStatus
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency("psycopg", "postgres") from exc

from ..sql._program import Rows, Statement
from ._binding import bound
from ._common import Begin, rows_of

__all__ = ["CAPACITY", "THRESHOLD", "Replay", "RoundTrip", "Sending", "Statements", "Switch",
           "answer"]

logger = logging.getLogger("flowmem")

THRESHOLD: Final = 2
"""Sends of a text on one connection before it is prepared (psycopg's ``prepare_threshold``
idea: a text sent once is not worth a ``PREPARE``)."""
CAPACITY: Final = 256
"""Prepared statements kept per connection (and texts counted towards :data:`THRESHOLD`)."""
LARGE: Final = 8192
"""Characters of text values above which a round trip prepares nothing new: PostgreSQL
keeps the WHOLE query string a ``PREPARE`` came in with, values included, as long as the
statement lives (measured: a 1 MB value, 1 MB kept per statement prepared with it)."""
MISMATCH: Final = frozenset({"26000", "42P05"})  # invalid_sql_statement_name, duplicate
UNINFERRED: Final = frozenset({"42P18", "42P08", "42725"})  # indeterminate, ambiguous types


class Replay(StoreError):
    """An error of a ``PREPARE``/``EXECUTE``/``DEALLOCATE`` this layer added: the
    transaction was aborted, nothing of it committed; run it once more (what failed is
    then sent as text)."""


class Switch:
    """Whether one store prepares, and the texts it never prepares (thread-safe)."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.refused: frozenset[str] = frozenset()
        self._lock = threading.Lock()

    def off(self, reason: str) -> None:
        """Prepared statements off for good (logs ONE warning naming the option)."""
        with self._lock:
            if not self.on:
                return
            self.on = False
        logger.warning("PostgreSQL prepared statements turned off for this store: %s "
                       "(behind a transaction-pooling proxy such as pgbouncer "
                       "pool_mode=transaction, set prepared=false in the store URL)", reason)

    def refuse(self, text: str) -> None:
        """Never prepare ``text`` again (PostgreSQL cannot infer its parameters' types)."""
        with self._lock:
            self.refused = self.refused | {text}


class Sending:
    """One round trip as rewritten by :meth:`Statements.plan`."""

    __slots__ = ("deallocates", "executes", "kept", "prepares", "statements")

    def __init__(self, statements: list[Statement], kept: list[int],
                 prepares: dict[int, tuple[str, str]], deallocates: dict[int, str],
                 executes: frozenset[int] | set[int]) -> None:
        self.statements = statements
        self.kept = kept
        """Where each of the caller's statements is in :attr:`statements`."""
        self.prepares = prepares
        """Position of each ``PREPARE``: (text, name)."""
        self.deallocates = deallocates
        """Position of each ``DEALLOCATE``: name."""
        self.executes = executes
        """Position of each ``EXECUTE``."""

    def ours(self, position: int) -> bool:
        """Whether the statement at ``position`` is one this layer added or rewrote."""
        return (position in self.executes or position in self.prepares
                or position in self.deallocates)


class Statements:
    """The prepared statements of ONE physical connection (one at a time uses it)."""

    def __init__(self, threshold: int | None = None, capacity: int | None = None) -> None:
        self.threshold = THRESHOLD if threshold is None else threshold
        self.capacity = CAPACITY if capacity is None else capacity
        self.prefix = f"fm_{secrets.token_hex(8)}_"
        self.serial = 0
        self.names: OrderedDict[str, tuple[str, str]] = OrderedDict()
        """Text -> (name, its ``EXECUTE`` with ``?`` for the values), least recent first."""
        self.seen: OrderedDict[str, int] = OrderedDict()  # texts not prepared: sends so far
        self.evicted: list[str] = []  # names to DEALLOCATE

    def plan(self, statements: Sequence[Statement], switch: Switch) -> Sending | None:
        """``statements`` as they are to be sent on this connection (``None``: unchanged)."""
        if not switch.on or not any(params for _, params in statements):
            return None
        out: list[Statement] = []
        prepares: dict[int, tuple[str, str]] = {}
        deallocates: dict[int, str] = {}
        for evicted in self.evicted:
            deallocates[len(out)] = evicted
            out.append((f"DEALLOCATE {evicted}", ()))
        self.evicted = []
        kept: list[int] = []
        executes: set[int] = set()
        used: set[str] = set()
        names = self.names
        for text, params in statements:
            entry = names.get(text) if params else None
            if entry is not None:
                names.move_to_end(text)
            elif params:
                entry = self._new(text, params, used, switch.refused, statements)
                if entry is not None:
                    prepares[len(out)] = (text, entry[0])
                    out.append((f"PREPARE {entry[0]} AS {_numbered(text)}", ()))
            if entry is None:
                kept.append(len(out))
                out.append((text, params))
                continue
            used.add(text)
            executes.add(len(out))
            kept.append(len(out))
            out.append((entry[1], params))
        return Sending(out, kept, prepares, deallocates, executes)

    def _new(self, text: str, params: Sequence[object], used: set[str],
             refused: frozenset[str], statements: Sequence[Statement]) -> tuple[str, str] | None:
        """A name and ``EXECUTE`` for ``text`` if it is to be prepared now (kept in
        :attr:`names` unless :meth:`settle` learns the ``PREPARE`` did not run), else
        ``None``: sent as text."""
        if text in refused or text.count("?") != len(params):
            return None  # (a miscounted statement: the binding says what is wrong)
        sends = self.seen.pop(text, 0) + 1
        if sends < self.threshold or _size(statements) > LARGE:
            self.seen[text] = sends
            if len(self.seen) > self.capacity:
                self.seen.popitem(last=False)
            return None
        if len(self.names) >= self.capacity:
            oldest = next(iter(self.names))
            if oldest in used:
                self.seen[text] = sends
                return None  # the cache holds only this round trip's statements
            self.evicted.append(self.names.pop(oldest)[0])
        self.serial += 1
        name = f"{self.prefix}{self.serial}"
        entry = self.names[text] = (name, f"EXECUTE {name}({', '.join('?' * len(params))})")
        return entry

    def settle(self, sending: Sending, ran: int | None) -> None:
        """Learn what the session holds: the first ``ran`` statements of ``sending`` ran,
        the rest did not (``None``: no answer came; a ``PREPARE`` then counts as not run,
        a ``DEALLOCATE`` as run)."""
        for position, (text, name) in sending.prepares.items():
            if ran is None or position >= ran:
                entry = self.names.get(text)
                if entry is not None and entry[0] == name:
                    del self.names[text]
        if ran is not None and sending.deallocates:
            self.evicted += [name for position, name in sending.deallocates.items()
                             if position >= ran]


def answer(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], results: Sequence[Any],
           head: Begin | None, sending: Sending | None, cache: Statements,
           switch: Switch) -> list[Rows]:
    """The rows of ``head``'s and the caller's statements of one round trip (as
    :func:`~flowmem.stores.postgres._common.rows_of`), once ``cache`` has learnt what the
    session holds; :class:`Replay` when the round trip failed at a statement this layer
    added (see the module notes)."""
    if sending is None:
        return rows_of(conn, results)
    count = head.count if head is not None else 0
    failed = bool(results) and results[-1].status == ExecStatus.FATAL_ERROR
    ran = len(results) - count - failed
    cache.settle(sending, max(ran, 0))
    if failed and sending.ours(ran):
        error = pg_errors.error_from_result(results[-1], encoding=conn.info.encoding)
        state = error.sqlstate or ""
        if state in MISMATCH:
            switch.off(f"the session's prepared statements are not this client's ({state})")
            raise Replay(f"PostgreSQL prepared statement mismatch ({state}): {error}") from error
        if ran in sending.prepares and state in UNINFERRED:
            text = sending.prepares[ran][0]
            switch.refuse(text)
            logger.warning("PostgreSQL cannot prepare a statement (%s); it is sent unprepared "
                           "from now on: %s", state, text)
            raise Replay(f"PostgreSQL could not prepare a statement ({state}): {error}") from error
    rows = rows_of(conn, results)
    return [*rows[:count], *(rows[count + position] for position in sending.kept)]


class RoundTrip:
    """One round trip of either face, all but its I/O: :attr:`sql` is what to send;
    :meth:`rows` reads the answer (:func:`answer`); :meth:`lost` says none came.

    ``head``'s ``sql`` goes first, then its ``lock`` statements and ``statements``
    (prepared alike). After an error, :attr:`failed` is where the failed statement
    is among ``head``'s and the caller's (``None``: one this layer added).
    """

    __slots__ = ("cache", "conn", "failed", "head", "sending", "sql", "switch")

    def __init__(self, conn: Any, switch: Switch, statements: Sequence[Statement],
                 head: Begin | None = None) -> None:
        if head is not None and head.lock:
            statements = (*head.lock, *statements)
        self.conn, self.switch, self.head = conn, switch, head
        self.cache: Statements = conn.statements
        self.sending = self.cache.plan(statements, switch)
        self.sql = bound(conn, statements if self.sending is None else self.sending.statements,
                         head)
        self.failed: int | None = None

    def lost(self) -> None:
        """No answer came (an error, a cancellation): what ran is not known."""
        if self.sending is not None:
            self.cache.settle(self.sending, None)

    def rows(self, results: Sequence[Any]) -> list[Rows]:
        """The rows of ``head``'s statements (its ``lock`` ones included), then of the
        caller's."""
        if results and results[-1].status == ExecStatus.FATAL_ERROR:
            self.failed = self._position(len(results) - 1)
        return answer(self.conn, results, self.head, self.sending, self.cache, self.switch)

    def _position(self, result: int) -> int | None:
        count = self.head.count if self.head is not None else 0
        if self.sending is None or result < count:
            return result
        sent = result - count
        return count + self.sending.kept.index(sent) if sent in self.sending.kept else None


def _size(statements: Sequence[Statement]) -> int:
    return sum(len(value) for _, params in statements for value in params
               if isinstance(value, str | bytes))


def _numbered(text: str) -> str:
    """``?`` placeholders as ``$1..$k`` (split as the binding splits them)."""
    parts = text.split("?")
    return parts[0] + "".join(f"${number}{part}"
                              for number, part in enumerate(parts[1:], start=1))
