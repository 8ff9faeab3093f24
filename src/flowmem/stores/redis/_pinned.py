"""A pinned :class:`~flowmem.stores.redis._requests.Pipe` on a Redis Cluster: every
command on ONE connection of the node serving the pipe's key.

``WAIT`` counts the replicas that acknowledged the *calling connection's* last
write, so the ``WAIT`` that confirms a script (``?wait_replicas=``) must run
on the script's own connection. A standalone pipeline is one connection
already. A cluster client would route ``WAIT`` to every primary, and its
pipeline follows a ``MOVED`` (or a lost connection) by sending the script
alone, elsewhere: then the ``WAIT`` would count another connection's writes.
So a pinned pipe goes to the primary of its key's slot only:

- blocking: that node's own ``redis.Redis`` client, one pipeline (one pooled
  connection, no retries);
- asyncio: a cluster pipeline whose every command names the node
  (``target_nodes``), redirections off (one connection of that node).

A ``MOVED`` reply to the script means it did not run (the slot moved: a
failover): the slot map is read again and the pipe sent once more, up to
:data:`TRIES` times. A lost connection or a cluster that is down has the slot
map read again too (the node may be gone, the next call must not go there
again), and is reported as usual: a lost connection after the script was sent
may have run it (:class:`~flowmem.errors.OutcomeUnknown`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Final

from ._requests import Pipe

__all__ = ["TRIES", "asend_pinned", "send_pinned"]

TRIES: Final = 3
"""Sends of a pinned pipe whose script was answered ``MOVED`` (not run)."""


def _errors() -> tuple[tuple[type[BaseException], ...], type[BaseException],
                       tuple[type[BaseException], ...]]:
    """redis-py's classes: a lost connection, ``MOVED``, and what has the slot map read
    again (those, and a cluster that is down)."""
    from redis import exceptions as ex

    lost = (ex.ConnectionError, ex.TimeoutError, OSError)
    away = (*lost, ex.ClusterDownError, ex.SlotNotCoveredError, ex.MovedError)
    return lost, ex.MovedError, away


def _quiet() -> tuple[type[BaseException], ...]:
    from redis import exceptions as ex

    return (ex.RedisError, ex.RedisClusterException, OSError)


def send_pinned(client: Any, request: Pipe) -> list[Any]:
    """Send ``request`` on the blocking cluster ``client``: its replies, errors as values
    (a lost connection raises)."""
    lost, moved, away = _errors()
    for attempt in range(1, TRIES + 1):
        node = client.get_node_from_key(request.pin)
        pipe = client.get_redis_connection(node).pipeline(transaction=False)
        for command in request.commands:
            pipe.execute_command(*command)
        try:
            replies = list(pipe.execute(raise_on_error=False))
        except lost:
            _refresh(client)
            raise
        if any(isinstance(reply, away) for reply in replies):
            _refresh(client)
        if attempt == TRIES or not isinstance(replies[0], moved):
            return replies
    raise AssertionError("unreachable")


async def asend_pinned(client: Any, request: Pipe) -> list[Any]:
    """Send ``request`` on the asyncio cluster ``client`` (as :func:`send_pinned`)."""
    lost, moved, away = _errors()
    for attempt in range(1, TRIES + 1):
        await client.initialize()  # nothing unless the client was closed for a refresh
        node = client.get_node_from_key(request.pin)
        pipe = client.pipeline()
        for command in request.commands:
            pipe.execute_command(*command, target_nodes=node)
        try:
            replies = list(await pipe.execute(raise_on_error=False, allow_redirections=False))
        except lost:
            await _arefresh(client)
            raise
        if any(isinstance(reply, away) for reply in replies):
            await _arefresh(client)
        if attempt == TRIES or not isinstance(replies[0], moved):
            return replies
    raise AssertionError("unreachable")


def _refresh(client: Any) -> None:
    """Read the slot map again, best effort (the next call tries again if it fails)."""
    with contextlib.suppress(*_quiet()):
        client.nodes_manager.initialize()


async def _arefresh(client: Any) -> None:
    with contextlib.suppress(*_quiet()):
        await client.nodes_manager.initialize()
