"""Erasing a user while 4 processes append to her conversations, then scanning the WHOLE
store (every SQLite table, every table of the PostgreSQL schema, every Redis key of the
prefix) for anything that names her.

Each writer process appends to her conversations (and, every third append, opens a
new one) with an idempotency key, logging when each append began and ended
(``time.monotonic``: one clock for every process) and whether it was acknowledged;
a writer stops at its first refusal (:class:`~flowmem.errors.ErasureInProgress`) or
when told to after the erasure returned. An append racing the erasure is either
erased or refused: every append acknowledged before the fence was last seen up
(:func:`~flowmem.testing.contract_erasure.left_behind`) left no trace. The race
itself is tests/support/erasure_race.py (the Redis Cluster tests run it too). When no
append was acknowledged after that, the scan must find nothing at all; otherwise
(a writer that never met the fence went on after the erasure) only the
conversations those later appends opened may remain, holding only their messages.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from backends import unavailable
from erasure_race import erasure_race
from erasure_scan import postgres_findings, redis_findings, sqlite_findings
from figures import Figure

pytestmark = pytest.mark.processes

@pytest.fixture(params=["sqlite", "postgres", "redis"])
def target(request: pytest.FixtureRequest,
           tmp_path: Path) -> Iterator[tuple[str, Callable[[list[str]], list[str]]]]:
    """``(url, scan)``: a store of each backend and the scan of its whole content."""
    reason = unavailable(request.param)
    if reason:
        pytest.skip(reason)
    if request.param == "sqlite":
        path = str(tmp_path / "erase.db")
        yield f"sqlite:///{path}", lambda needles: sqlite_findings(path, needles)
    elif request.param == "postgres":
        from postgres_support import throwaway_schema

        with throwaway_schema(f"erase_{uuid.uuid4().hex[:8]}") as (url, schema):
            yield url, lambda needles: postgres_findings(schema, needles)
    else:
        from redis_support import drop_prefix, raw_client, session_prefix, url_with

        prefix = session_prefix()
        client = raw_client()
        try:
            yield url_with(prefix), lambda needles: redis_findings(client, prefix, needles)
        finally:
            drop_prefix(prefix)
            client.close()


def test_erasure_under_four_appending_processes(
        target: tuple[str, Callable[[list[str]], list[str]]], tmp_path: Path,
        figure: Figure) -> None:
    figure(erasure_race(*target, tmp_path))
