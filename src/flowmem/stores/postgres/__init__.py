"""``postgresql://user@host:port/db`` — the store for many workers on many machines.

Needs ``pip install 'flowmem[postgres]'``. :class:`PostgresStore` is the
blocking face, :class:`AsyncPostgresStore` the asyncio one; both run the same
sans-I/O programs, and the blocking one is generated from the asyncio one
(``scripts/unasync.py``: ``_sync.py`` from ``_async.py``; what the two faces
cannot share by token substitution is in :mod:`._common`). The asyncio face
opens on first use (``from_url`` needs no running loop); the blocking one
connects and sets the schema up when it is made (failing fast).

One row per message (the programs of :mod:`flowmem.stores.sql._conversations`, every
statement naming the conversation key: :mod:`flowmem.stores.postgres._programs`); an
append is one ``READ COMMITTED`` transaction of indexed statements, in two round
trips (below). Tables live in a dedicated schema, created at the baseline (and later
upgraded) by :func:`flowmem.stores.postgres._schema.migrate` when the store opens;
every table leads its primary key with the conversation key, a distribution key
(``?partitions=N``: hash partitions of it).

URL options (``schema``, ``pool_min``/``pool_max``, ``pool_timeout``,
``statement_timeout``, ``prepared``, ``partitions``; the rest of the query string goes to
libpq), the libpq defaults flowmem sets, and the bound of every wait (each
ends in a typed error) are tabled in ``docs/deploy.md``; the client's
deadline is :mod:`flowmem.stores.postgres._deadline`'s.

Round trips: every step of a program (a statement, or a
:class:`~flowmem.stores.sql._program.Batch`) is ONE query string, its values
bound on the client, as psycopg's ``ClientCursor`` binds them
(:mod:`flowmem.stores.postgres._binding`; as psycopg2 always did: a failed
statement in the server's log, or ``pg_stat_activity``, shows them), and sent
in the simple protocol (psycopg's pipeline mode costs more client CPU than
it saves). With ``prepared=true`` a statement the connection has sent before
goes as ``EXECUTE`` of a statement prepared on that connection, the values
bound the same way (:mod:`flowmem.stores.postgres._prepared`): PostgreSQL
parses and plans it once per connection instead of on every turn.
The first step also carries ``BEGIN``, the search path, the timeouts and, for
a writer, the MEM-12 lock; a final batch also carries ``COMMIT``. So the
common append — an existing conversation, no window — is two round trips:
the lock, the conversation's row ``FOR UPDATE`` and the planner's view; then
the whole plan, the row's update and ``COMMIT``
(:mod:`flowmem.stores.sql._apply`); an append's tail (``tail=N``) is read last in
it, unless the store's own copy of the newest entries serves it
(:mod:`flowmem.stores.postgres._tails`). A new conversation takes one more,
healing one more per healed turn (MEM-3), a window that evicts one more.

Transaction pooling (pgbouncer ``pool_mode = transaction``) works with
``prepared=false``: no statement is prepared (psycopg's
``prepare_threshold=None`` too) and no session state is set — the search
path and the timeouts are ``SET LOCAL``, the MEM-12 lock is
transaction-level. Left on there, the first statement that meets a server
session without it turns prepared statements off for the store (one
warning) and its transaction runs again, unprepared
(:class:`~flowmem.stores.postgres._prepared.Replay`).

MEM-12: an append takes ``pg_advisory_xact_lock`` on a 64-bit hash of
(schema, scope, scope id, key) under a ``lock_timeout`` of its bounded wait, in
one prepared statement that then sets the statement timeout and the row's wait
(:func:`~flowmem.stores.postgres._common.begin`). When the wait times out (the
error is that statement's), the transaction starts over without the lock (one
round trip more) and the append goes ahead unserialized (``serialized=False``),
still atomic: the conversation's row is read ``FOR UPDATE`` and the (buffer,
result id) unique key makes a doubled result impossible. The row wait is
bounded too (what is left of ``lock_timeout``, at least 0.5 s); a row held past
it (by a transaction outside flowmem) is ``StoreBusy``. The lock ends with the
transaction, or the client.

Failures: connection loss (or the server going away) raises
:class:`~flowmem.errors.StoreUnavailable`, any other server error
:class:`~flowmem.errors.StoreError`; the transaction is rolled back, so the
buffer is as it was. If the connection is lost while ``COMMIT`` is in flight
— during an append's last round trip, which carries it — the outcome is
unknown to the client and the error says so. A pooled connection found dead
on the first round trip (nothing committed) is replaced by another (at most
``pool_max`` times) before giving up; one cut by the client's deadline is not
retried.

The asyncio face keeps the same bounds: the client's deadline is kept by
the same watchdog thread, which shuts the connection's socket down — the
event loop's reader sees end-of-file at once; no ``asyncio`` timeout is
used, because cancelling psycopg mid-query makes it send a cancel request and
wait again, which a frozen server never answers. A task cancelled inside a
transaction rolls it back (or, if the connection is left mid-statement, the
pool discards the connection and the server rolls back), so an operation is
applied whole or not at all; the advisory lock is transaction-level and goes
with the transaction. A cancellation that lands while ``COMMIT`` is in flight
leaves the outcome to the server: whole or nothing, never part. The rollback
after a cancellation still runs under the operation's deadline.
"""

from __future__ import annotations

from ._async import AsyncPostgresStore
from ._sync import PostgresStore

__all__ = ["AsyncPostgresStore", "PostgresStore"]
