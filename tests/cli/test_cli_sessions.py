"""``flowmem sessions list|show|create|stop``, ``sessions viewers add|remove`` and
``flowmem transcript SESSION``: the registry of ``flowmem serve`` from the shell.

Each command through click's ``CliRunner`` and as a real subprocess; every bad
input answers a message and exit 1 or 2, never a traceback, and changes nothing.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from flowmem import AsyncMemory
from flowmem.cli._main import main
from flowmem.service._sessions import TRANSCRIPT_KEY, SessionRegistry, session_context

pytestmark = pytest.mark.processes

FLOWMEM = str(Path(sys.executable).parent / "flowmem")
UNKNOWN = "0" * 32


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'sessions.db'}"


def _cli(url: str, *args: str) -> Any:
    result = CliRunner().invoke(main, [*args, "--store", url])
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        result.exception, result.output)
    return result


def _ok(url: str, *args: str) -> str:
    result = _cli(url, *args)
    assert result.exit_code == 0, result.output
    return str(result.output)


def _registry(url: str, work: Any) -> Any:
    async def run() -> Any:
        async with AsyncMemory.from_url(url) as memory:
            return await work(SessionRegistry(memory.store), memory)
    return asyncio.run(run())


def _append(url: str, session_id: str, messages: list[dict[str, Any]]) -> None:
    async def work(registry: SessionRegistry, memory: AsyncMemory) -> None:
        record = await registry.load(session_id)
        assert record is not None
        await memory.append("session", TRANSCRIPT_KEY, messages,
                            context=session_context(record))
    _registry(url, work)


def test_create_show_list_stop_viewers(tmp_path: Path) -> None:
    url = _url(tmp_path)
    sid = _ok(url, "sessions", "create", "--owner", "alice", "--title", "weather").strip()
    record = _registry(url, lambda registry, _: registry.load(sid))
    assert record is not None and record.owner == "alice" and record.title == "weather"
    other = json.loads(_ok(url, "sessions", "create", "--owner-less", "--json"))
    assert other["owner"] is None and other["status"] == "idle"

    shown = json.loads(_ok(url, "sessions", "show", sid))
    assert shown["id"] == sid and shown["status"] == "idle" and shown["messages"] == 0
    _append(url, sid, [{"role": "user", "content": "Weather in Paris?"}])
    assert json.loads(_ok(url, "sessions", "show", sid))["messages"] == 1

    table = _ok(url, "sessions", "list").splitlines()
    assert table[0].split()[:3] == ["ID", "OWNER", "STATUS"] and len(table) == 3
    every = [json.loads(line) for line in _ok(url, "sessions", "list", "--json").splitlines()]
    assert sorted(r["id"] for r in every) == sorted([sid, other["id"]])
    mine = _ok(url, "sessions", "list", "--user", "alice", "--json").splitlines()
    assert [json.loads(line)["id"] for line in mine] == [sid]
    assert len(_ok(url, "sessions", "list", "--limit", "1", "--json").splitlines()) == 1
    assert _ok(url, "sessions", "list", "--offset", "2", "--json") == ""
    second = _ok(url, "sessions", "list", "--offset", "1", "--limit", "1", "--json")
    assert json.loads(second)["id"] == other["id"]  # oldest first: by creation time

    added = json.loads(_ok(url, "sessions", "viewers", "add", sid, "bob"))
    assert added["viewers"] == ["bob"]
    shared = _ok(url, "sessions", "list", "--user", "bob", "--shared", "--json").splitlines()
    assert [json.loads(line)["id"] for line in shared] == [sid]
    assert json.loads(_ok(url, "sessions", "viewers", "remove", sid, "bob"))["viewers"] == []
    assert _ok(url, "sessions", "list", "--user", "bob", "--shared", "--json") == ""

    assert json.loads(_ok(url, "sessions", "stop", sid))["status"] == "stopped"
    record = _registry(url, lambda registry, _: registry.load(sid))
    assert record.status == "stopped"


def test_transcript_of_a_session(tmp_path: Path) -> None:
    """MEM-3 and MEM-10 marked in a session's transcript, as for any conversation."""
    url = _url(tmp_path)
    sid = _ok(url, "sessions", "create", "--owner", "alice", "--title", "cats").strip()
    call = {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    _append(url, sid, [{"role": "user", "content": "Find cats"},
                       {"role": "assistant", "content": None, "tool_calls": [call]},
                       {"role": "user", "content": "Well?"}])
    healed = _ok(url, "transcript", sid, "--no-color", "--width", "100")
    assert "cats" in healed and "Find cats" in healed and "healed" in healed.lower()
    _append(url, sid, [{"role": "tool", "tool_call_id": "c1", "content": "3 cats"}])
    late = _ok(url, "transcript", sid, "--no-color", "--width", "100")
    assert "3 cats" in late and "late" in late.lower()
    empty = _ok(url, "sessions", "create", "--owner", "bob").strip()
    assert "0 messages" in _ok(url, "transcript", empty, "--no-color")


def _bad_inputs(sid: str) -> list[tuple[list[str], int, str]]:
    return [
        (["sessions", "show", "nope"], 1, "no session"),
        (["sessions", "show", UNKNOWN], 1, "no session"),
        (["sessions", "stop", UNKNOWN], 1, "no session"),
        (["sessions", "viewers", "add", "nope", "bob"], 1, "no session"),
        (["sessions", "viewers", "remove", UNKNOWN, "bob"], 1, "no session"),
        (["sessions", "viewers", "add", sid, " "], 2, "usable user id"),
        (["sessions", "viewers", "add", sid], 2, "Missing argument"),
        (["sessions", "create"], 2, "exactly one of"),
        (["sessions", "create", "--owner", "a", "--owner-less"], 2, "exactly one of"),
        (["sessions", "create", "--owner", "0"], 2, "usable user id"),
        (["sessions", "create", "--owner", "a", "--title", "x" * 201], 2, "200"),
        (["sessions", "list", "--shared"], 2, "--shared needs --user"),
        (["sessions", "list", "--user", ""], 2, "usable user id"),
        (["sessions", "list", "--limit", "0"], 2, "--limit"),
        (["sessions", "list", "--offset", "-1"], 2, "--offset"),
        (["sessions", "frobnicate"], 2, "No such command"),
        (["transcript", "nope"], 1, "no session"),
        (["transcript"], 2, "SESSION"),
        (["transcript", sid, "--scope", "user"], 2, "SESSION"),
        (["transcript", sid, "--last", "0"], 2, "--last"),
    ]


def test_bad_input_is_a_message_and_changes_nothing(tmp_path: Path) -> None:
    url = _url(tmp_path)
    sid = _ok(url, "sessions", "create", "--owner", "alice").strip()
    before = _ok(url, "sessions", "list", "--json")
    for args, code, words in _bad_inputs(sid):
        result = _cli(url, *args)
        assert result.exit_code == code, (args, result.output)
        assert words in result.output and "Traceback" not in result.output, (args, result.output)
    assert _ok(url, "sessions", "list", "--json") == before


@pytest.mark.parametrize("scheme", ["nope://x", "sqlite:///no/such/dir/x.db",
                                    "redis://127.0.0.1:6379/15?prefx=1"])
def test_a_bad_store_is_a_message(scheme: str) -> None:
    result = CliRunner().invoke(main, ["sessions", "list", "--store", scheme])
    assert result.exit_code == 1 and "Error:" in result.output, result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception,
                                                                     SystemExit)


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FLOWMEM, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1"})


def test_every_subcommand_as_a_real_process(tmp_path: Path) -> None:
    """The same commands as a user runs them: ./flowmem.db, no traceback on any input."""
    sid = _run(tmp_path, "sessions", "create", "--owner", "alice", "--title", "t").stdout.strip()
    assert len(sid) == 32, sid
    for args in (["sessions", "list"], ["sessions", "list", "--json"],
                 ["sessions", "show", sid], ["sessions", "viewers", "add", sid, "bob"],
                 ["sessions", "viewers", "remove", sid, "bob"], ["sessions", "stop", sid],
                 ["transcript", sid], ["sessions", "--help"], ["sessions", "viewers", "--help"]):
        done = _run(tmp_path, *args)
        assert done.returncode == 0 and not done.stderr, (args, done.stderr)
    assert json.loads(_run(tmp_path, "sessions", "show", sid).stdout)["status"] == "stopped"
    for args, code, words in [*_bad_inputs(sid), (["sessions", "list", "--store", "nope://"],
                                                   1, "Error:")]:
        done = _run(tmp_path, *args)
        assert done.returncode == code, (args, done.stdout, done.stderr)
        assert words in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)


def test_every_option_has_help() -> None:
    from flowmem.cli._sessions import sessions

    commands = [*sessions.commands.values(), *sessions.commands["viewers"].commands.values()]
    for command in commands:
        assert command.help
        for param in command.params:
            if param.param_type_name == "option":
                assert param.help, (command.name, param.name)
