"""``flowmem sweep`` and ``flowmem serve --retention``: counts by scope, one-line refusals."""

from __future__ import annotations

import asyncio
from pathlib import Path

from click.testing import CliRunner, Result

from flowmem import AsyncMemory, ExecutionContext, Memory
from flowmem.cli._exit import OK, USAGE
from flowmem.cli._main import main
from flowmem.service import TRANSCRIPT_KEY, SessionRegistry, session_context
from flowmem.service._registry import RESERVED_SCOPE


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def test_sweep_deletes_what_expired_and_says_how_many(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    with Memory.from_url(url, retention={"session": 60, "user": 60},
                         clock=lambda: 1_000_000.0) as memory:  # long expired by now
        for number in range(3):
            context = ExecutionContext(user_id=f"u{number}", session_id=f"s{number}")
            memory.append("session", "talk", {"role": "user", "content": "hi"},
                          context=context)
        memory.write("user", "pref", 1, context=ExecutionContext(user_id="u0"))
    swept = cli("sweep", "--store", url, "--batch", "2")
    assert (swept.exit_code, swept.stdout) == (OK, "swept 4 expired (session=3, user=1)\n")
    again = cli("sweep", "--store", url)
    assert (again.exit_code, again.stdout) == (OK, "swept 0 expired (none)\n")


def test_a_bad_policy_or_batch_is_a_usage_error_on_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    for args in (("serve", "--store", url, "--retention", "session=soon"),
                 ("serve", "--store", url, "--retention", "nowhere=1d"),
                 ("sweep", "--store", url, "--batch", "0")):
        result = cli(*args)
        assert result.exit_code == USAGE, (args, result.output)
        assert "Traceback" not in result.output
    assert not (tmp_path / "r.db").exists()  # refused before anything was opened


def test_a_sweep_of_redis_deletes_nothing_itself() -> None:
    # Redis deletes expired keys by its own expiry: the sweep has nothing to count
    result = cli("sweep", "--store", "redis://127.0.0.1:6379/15?prefix=flowmem_cli_sweep")
    assert (result.exit_code, result.stdout) == (OK, "swept 0 expired (none)\n")


def test_sweep_with_the_serve_policy_deletes_expired_session_records(tmp_path: Path) -> None:
    # the records of flowmem serve's sessions expire with their transcripts under the
    # session policy: given the same --retention, a sweep from cron deletes them too
    url = f"sqlite:///{tmp_path / 'r.db'}"

    async def old_sessions() -> None:
        async with AsyncMemory.from_url(url, retention={"session": 60},
                                        clock=lambda: 1_000_000.0) as memory:
            registry = SessionRegistry(memory.store, retention=memory.retention,
                                       clock=memory.clock)
            for owner in ("alice", "bob"):
                record = await registry.create(owner, "t")
                await memory.append("session", TRANSCRIPT_KEY,
                                    {"role": "user", "content": "hi"},
                                    context=session_context(record))

    asyncio.run(old_sessions())
    swept = cli("sweep", "--store", url, "--retention", "session=60s")
    assert (swept.exit_code, swept.stdout) == (
        OK, "swept 4 expired (session=2, session_record=2)\n")

    async def records_left() -> list[str]:
        async with AsyncMemory.from_url(url) as memory:
            return await memory.store.keys(RESERVED_SCOPE, "sessions", limit=10)

    assert asyncio.run(records_left()) == []
