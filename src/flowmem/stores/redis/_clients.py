"""The Redis clients a store URL names: standalone or cluster, blocking or asyncio.

A URL names one node (or several seeds); whether it is a cluster is asked on
connect (``INFO cluster``) unless ``?cluster=yes|no`` says. redis-py never
retries on its own: flowmem decides what may be sent again.
"""

from __future__ import annotations

import re
from typing import Any, Final
from urllib.parse import parse_qsl, urlsplit

from ...errors import InvalidStoreURL, StoreError, StoreUnavailable
from ._drivers import Driver, import_redis, one_line, peeking
from ._keys import URL_OPTIONS, StoreURL, split_url
from ._programs import Pipe

__all__ = ["cluster_enabled", "import_redis", "make_client", "open_blocking"]


_DEFAULTS: Final = {"socket_timeout": 10.0, "socket_connect_timeout": 5.0}


def make_client(url: str, *, asyncio_face: bool, cluster: bool | None = None,
                ) -> tuple[Any, StoreURL, float | None]:
    """``(client, the URL's parts, round-trip timeout)`` for a store URL; connects nothing
    (but a blocking cluster client, which reads the slot map at once).

    ``cluster`` (``None``: the URL's ``?cluster=``, else a standalone client, for
    :func:`cluster_enabled` to decide): ``True`` makes a redis-py cluster client
    seeded from every node the URL names. Other query options go to redis-py
    (``socket_timeout=10`` and ``socket_connect_timeout=5`` seconds unless
    given); redis-py never retries on its own (flowmem decides what may be
    retried; a cluster client still follows MOVED and ASK: those were not run).
    On the asyncio face the socket timeout of a standalone client is taken out of
    redis-py (which wraps every send in ``asyncio.wait_for``: a task per send on
    Python 3.11) and returned, for the driver to bound each round trip with one
    ``asyncio.timeout`` instead.
    """
    parts = split_url(url)
    _check_wait(url, parts)
    if cluster is None:
        cluster = parts.cluster if parts.cluster is not None else len(parts.nodes) > 1
    if cluster:
        return _cluster_client(url, parts, asyncio_face=asyncio_face), parts, None
    redis = import_redis()
    from redis.backoff import NoBackoff

    factory: Any
    retry: Any
    if asyncio_face:
        from redis.asyncio import Redis as AsyncRedis
        from redis.asyncio.retry import Retry as AsyncRetry

        factory, retry = AsyncRedis, AsyncRetry(NoBackoff(), 0)
    else:
        from redis.retry import Retry

        factory, retry = redis.Redis, Retry(NoBackoff(), 0)
    try:
        client = factory.from_url(parts.url, **_DEFAULTS, retry=retry)
        pool = client.connection_pool  # unknown options fail here, not at first use
        pool.connection_class(**pool.connection_kwargs)
    except (ValueError, TypeError) as exc:
        raise _url_error(url, exc) from None
    timeout = None
    if asyncio_face:
        timeout = pool.connection_kwargs.get("socket_timeout")
        pool.connection_kwargs["socket_timeout"] = None
        pool.connection_class = peeking(pool.connection_class)
    return client, parts, timeout


def _cluster_client(url: str, parts: StoreURL, *, asyncio_face: bool) -> Any:
    """A ``redis.cluster.RedisCluster`` (or its asyncio twin) seeded from every node."""
    redis = import_redis()
    from redis.backoff import NoBackoff

    if parts.db != 0:
        raise InvalidStoreURL(f"a Redis Cluster has only database 0; {url!r} names "
                              f"database {parts.db}")
    factory: Any
    node: Any
    retry: Any
    if asyncio_face:
        from redis.asyncio.cluster import ClusterNode as AsyncNode
        from redis.asyncio.cluster import RedisCluster as AsyncCluster
        from redis.asyncio.retry import Retry as AsyncRetry

        factory, node, retry = AsyncCluster, AsyncNode, AsyncRetry(NoBackoff(), 0)
    else:
        from redis.cluster import ClusterNode, RedisCluster
        from redis.retry import Retry

        factory, node, retry = RedisCluster, ClusterNode, Retry(NoBackoff(), 0)
    seeds = [node(host, port) for host, port in parts.nodes[1:]]
    try:
        return factory.from_url(parts.url, startup_nodes=seeds, **_DEFAULTS, retry=retry)
    except (ValueError, TypeError) as exc:
        raise _url_error(url, exc) from None
    except redis.exceptions.RedisClusterException as exc:
        raise StoreUnavailable(f"Redis Cluster unreachable at {_seeds(parts)}: "
                               f"{one_line(exc)}") from exc


def _check_wait(url: str, parts: StoreURL) -> None:
    """A ``WAIT`` blocks the reply up to ``wait_timeout``: it must fit in the socket's
    read timeout, or every unconfirmed change would also drop its connection."""
    if not parts.wait_replicas:
        return
    given = dict(parse_qsl(urlsplit(parts.url).query)).get("socket_timeout")
    bound = _DEFAULTS["socket_timeout"]
    if given:
        try:
            bound = float(given)
        except ValueError:
            return  # redis-py refuses it with its own message
    if parts.wait_timeout >= bound:
        raise InvalidStoreURL(f"wait_timeout ({parts.wait_timeout:g} s) must be shorter "
                              f"than socket_timeout ({bound:g} s), in {url!r}")


def _seeds(parts: StoreURL) -> str:
    return ", ".join(f"{host}:{port}" for host, port in parts.nodes)


def cluster_enabled(info: Any) -> bool:
    """Whether an ``INFO cluster`` reply says ``cluster_enabled:1``."""
    if isinstance(info, dict):
        return bool(int(info.get("cluster_enabled", 0)))
    return b"cluster_enabled:1" in info if isinstance(info, bytes) else False


def open_blocking(url: str) -> tuple[Any, StoreURL, bool]:
    """The blocking client for ``url``: a cluster client when the URL says so or its
    node answers ``INFO cluster`` with ``cluster_enabled:1``; and whether it is one."""
    client, parts, _ = make_client(url, asyncio_face=False)
    if parts.cluster is None and len(parts.nodes) <= 1:
        driver = Driver(client)
        try:
            info = driver.execute(Pipe((("INFO", "cluster"),)), "connect")[0]
            if isinstance(info, StoreError):
                raise info
        except BaseException as exc:
            client.close()
            raise driver.mapped(exc, "connect") from None
        if cluster_enabled(info):
            client.close()
            client, parts, _ = make_client(url, asyncio_face=False, cluster=True)
            return client, parts, True
        return client, parts, False
    return client, parts, bool(parts.cluster or len(parts.nodes) > 1)


def _url_error(url: str, exc: Exception) -> InvalidStoreURL:
    """Our own message for a URL redis-py refuses: a misspelled option lists the known ones."""
    unknown = re.search(r"unexpected keyword argument '([^']+)'", str(exc))
    if unknown is None:
        return InvalidStoreURL(f"cannot use {url!r}: {exc}")
    from redis.connection import URL_QUERY_ARGUMENT_PARSERS

    known = ", ".join([*URL_OPTIONS, *sorted(URL_QUERY_ARGUMENT_PARSERS)])
    return InvalidStoreURL(f"unknown option {unknown[1]!r} in the Redis URL {url!r}; "
                           f"known options: {known}")
