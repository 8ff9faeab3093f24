"""Read replicas with read-your-writes (stores/postgres/_replicas.py), on a REAL streaming
standby: a private primary is started, a standby made from it (``pg_basebackup -R``) and
started; an AsyncMemory whose URL names the standby as ``?replica=`` reads right after each
acknowledged append and always sees it. A standby given as the primary is one clear
error. Skips with the reason where the servers cannot start."""

from __future__ import annotations

import asyncio
import random
import subprocess
from collections.abc import Iterator

import pytest

import postgres_private
from backends import unavailable
from flowmem.async_memory import AsyncMemory
from flowmem.errors import StoreError
from flowmem.scopes import ExecutionContext

pytestmark = [pytest.mark.postgres, pytest.mark.processes,
              pytest.mark.xdist_group("postgres_replicas"),
              pytest.mark.skipif(unavailable("postgres") is not None,
                                 reason=unavailable("postgres") or "")]


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[str, str]]:
    """``(primary URL, standby URL)`` of a private primary and its streaming standby."""
    primary = postgres_private.start()
    if isinstance(primary, str):
        pytest.skip(primary)
    standby = postgres_private.PrivatePostgres(
        primary.bindir, primary.datadir.parent / "standby", postgres_private._free_port(),
        primary.run_as)
    try:
        subprocess.run([*primary.run_as, str(primary.bindir / "pg_basebackup"), "-h",
                        "127.0.0.1", "-p", str(primary.port), "-U", "postgres", "-D",
                        str(standby.datadir), "-R", "-X", "stream", "--no-sync"],
                       check=True, capture_output=True, timeout=120)
        standby.options = primary.options.replace(f"port={primary.port}",
                                                  f"port={standby.port}").replace(
            f"unix_socket_directories={primary.datadir}",
            f"unix_socket_directories={standby.datadir}")
        standby._pg_ctl("start", "-o", standby.options)
    except (subprocess.SubprocessError, OSError) as exc:
        primary.remove()
        pytest.skip(f"cannot start a streaming standby: {exc} "
                    f"{(getattr(exc, 'stderr', b'') or b'').decode()[-300:]}")
    try:
        yield primary.url, standby.url
    finally:
        standby.remove()
        primary.remove()


def test_a_read_right_after_an_acknowledged_append_sees_it_through_a_replica(
        servers: tuple[str, str]) -> None:
    primary, standby = servers
    chooser = random.Random(7)

    async def run() -> dict[str, int]:
        url = f"{primary}?schema=replicated&replica={standby}"
        async with AsyncMemory.from_url(url) as memory:
            contexts = [ExecutionContext(user_id=f"u{i}") for i in range(4)]
            for turn in range(60):
                context = chooser.choice(contexts)
                await memory.append("user", "chat", [{"role": "user", "content": f"m{turn}"}],
                                    context=context)
                page = await memory.history("user", "chat", context=context)
                assert page.messages[-1]["content"] == f"m{turn}"
            return dict(memory.store.routed)  # type: ignore[attr-defined]

    routed = asyncio.run(run())
    assert routed["replica"] > 0, routed  # the standby served reads
    assert sum(routed.values()) == 60


def test_a_standby_given_as_the_primary_is_one_clear_error(servers: tuple[str, str]) -> None:
    _, standby = servers

    async def run() -> None:
        async with AsyncMemory.from_url(f"{standby}?schema=replicated") as memory:
            await memory.history("user", "chat", context=ExecutionContext(user_id="u"))

    with pytest.raises(StoreError, match="standby"):
        asyncio.run(run())
