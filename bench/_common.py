"""What several bench scripts share: /proc readings, interleaved rounds, markdown tables,
URLs and Redis clean-up.

Every script runs as a module from the repository root, ``python -m bench.NAME``
(as a file, ``bench/http.py`` would shadow the standard library's ``http``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit

SUPPORT = str(Path(__file__).resolve().parents[1] / "tests" / "support")  # private servers
_TICK = os.sysconf("SC_CLK_TCK")
K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


def proc_value(path: str, prefix: str) -> str | None:
    """The value of the first line of a /proc file that starts with ``prefix``, if any."""
    try:
        with open(path, encoding="utf-8") as lines:
            return next((line.split(":", 1)[1].strip() for line in lines
                         if line.startswith(prefix)), None)
    except OSError:
        return None


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a running process and its running children, from
    Linux ``/proc`` (0 for a process that is gone or not readable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0.0
    children: list[int] = []
    for task in tasks:
        try:  # a thread (or the process) may end while it is read
            children += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
    return (int(fields[11]) + int(fields[12])) / _TICK + sum(map(cpu_seconds, children))


def interleaved(rounds: int, runs: dict[K, Callable[[], T]]) -> dict[K, list[T]]:
    """Each of ``runs`` once a round, in turn, so all see the same machine; their results."""
    results: dict[K, list[T]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            results[name].append(run())
    return results


def table(header: list[str], rows: list[list[str]], align: str = "") -> str:
    """A markdown table; ``align`` a letter a column, ``l`` or ``r`` (default: the first
    column left, the others right)."""
    align = align or "l" + "r" * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def with_query(url: str, query: str) -> str:
    """``url`` with ``query`` (``name=value&...``) added to its query string."""
    return f"{url}{'&' if '?' in url else '?'}{query}"


def drop_redis_prefix(url: str, prefix: str) -> None:
    """Delete the keys a run wrote under ``prefix`` (hash-tagged or not), nothing else."""
    import redis

    with redis.Redis.from_url(url) as client:
        for pattern in ("{" + prefix + ":*", prefix + ":*"):
            keys = list(client.scan_iter(match=pattern, count=1000))
            for at in range(0, len(keys), 500):
                client.delete(*keys[at:at + 500])


@contextmanager
def fresh_store(url: str, name: str) -> Iterator[str]:
    """``url`` with a PostgreSQL schema or a Redis key prefix ``name`` of this run's own (in
    place of any it named), removed afterwards: a shared server keeps nothing. Any other
    store's URL as it is."""
    parts = urlsplit(url)
    option = {"postgresql": "schema", "postgres": "schema", "redis": "prefix"}.get(parts.scheme)
    if option is None:
        yield url
        return
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != option] + [(option, name)]
    try:
        yield parts._replace(query=urlencode(query)).geturl()
    finally:
        _drop(parts._replace(query="").geturl(), option, name)


def _drop(server: str, option: str, name: str) -> None:
    """Remove what a run wrote under the schema or prefix ``name`` (nothing to remove from a
    server it could not reach)."""
    if option == "prefix":
        import redis

        with suppress(redis.ConnectionError):
            drop_redis_prefix(server, name)
        return
    import psycopg

    with suppress(psycopg.OperationalError), psycopg.connect(server, autocommit=True,
                                                             connect_timeout=5) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
