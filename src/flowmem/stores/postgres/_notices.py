"""LISTEN/NOTIFY for the service's change notices (:mod:`flowmem.stores._notices`).

``publish`` is one ``pg_notify`` in a transaction of the store's pool (it works
through a transaction-pooling proxy: the notice leaves at ``COMMIT``).
``follow`` keeps ONE connection of its own that LISTENs: a LISTEN needs a
session, so behind a transaction-pooling proxy the store URL's ``listen``
option names the PostgreSQL server itself. The channel is named after the
store's schema, so stores of two schemas do not hear each other.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

import psycopg
from psycopg import pq

from ..sql._program import Batch, Program
from ._options import PostgresOptions, connect_kwargs

__all__ = ["PostgresNotices", "channel_of"]

logger = logging.getLogger("flowmem")
_BACKOFF: Final = (0.05, 0.2, 1.0, 2.0)


def channel_of(schema: str) -> str:
    """The channel of a schema's notices (an identifier, whatever the schema's name)."""
    return "flowmem_" + hashlib.sha256(schema.encode()).hexdigest()[:24]


async def _relay(pgconn: Any, notice: Callable[[str], None]) -> None:
    """Hand each notice on ``pgconn`` to ``notice`` as it arrives, until the connection
    fails (raises :class:`psycopg.OperationalError`).

    Waits on the socket: psycopg's ``notifies()`` wakes every 0.1 s to look for
    one, which an otherwise idle process would pay for all day.
    """
    loop = asyncio.get_running_loop()
    readable = asyncio.Event()
    fd = pgconn.socket
    loop.add_reader(fd, readable.set)
    try:
        while True:
            await readable.wait()
            readable.clear()
            pgconn.consume_input()
            if pgconn.status != pq.ConnStatus.OK:
                raise psycopg.OperationalError("the LISTEN connection was closed")
            while (found := pgconn.notifies()) is not None:
                notice(found.extra.decode("utf-8", "replace"))
    finally:
        loop.remove_reader(fd)


def _notify(channel: str, payload: str) -> Program[None]:
    yield Batch((("SELECT pg_notify(?, ?)", (channel, payload)),), final=True)


class PostgresNotices:
    """The notice feed of one PostgreSQL store (see the module notes)."""

    def __init__(self, options: PostgresOptions,
                 send: Callable[[str, str], Awaitable[None]]) -> None:
        self._conninfo = options.listen or options.conninfo
        self._channel = channel_of(options.schema)
        self._send = send

    @classmethod
    def of(cls, store: Any) -> PostgresNotices:
        """The feed of an :class:`~flowmem.stores.postgres.AsyncPostgresStore`."""
        async def send(channel: str, payload: str) -> None:
            await store._value(lambda: _notify(channel, payload))

        return cls(store._options, send)

    async def publish(self, payload: str) -> None:
        await self._send(self._channel, payload)

    async def follow(self, connected: Callable[[], None], notice: Callable[[str], None],
                     lost: Callable[[], None]) -> None:
        failures = 0
        while True:
            try:
                conn: Any = await psycopg.AsyncConnection.connect(
                    self._conninfo, **connect_kwargs(self._conninfo))
            except psycopg.Error as exc:
                logger.warning("flowmem: cannot LISTEN for changes (%s); reading the shared "
                               "record per request meanwhile", exc)
            else:
                try:
                    async with conn:
                        await conn.execute(f'LISTEN "{self._channel}"')
                        failures = 0
                        connected()
                        await _relay(conn.pgconn, notice)
                except psycopg.Error as exc:
                    logger.warning("flowmem: the LISTEN connection dropped (%s); "
                                   "reconnecting", exc)
                finally:
                    lost()
            await asyncio.sleep(_BACKOFF[min(failures, len(_BACKOFF) - 1)])
            failures += 1
