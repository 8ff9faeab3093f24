"""Bad input on the command line: always a message and an exit code, never a traceback.

Exit codes (flowmem.cli._common): 1 invalid input or store error, 2 usage error,
3 refused scope (MEM-6, MEM-7, MEM-13).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from backends import Backend
from flowmem.cli._main import main

DEEP = [150, 1_000, 100_000]


def cli(*args: str, stdin: str | None = None) -> Result:
    result = CliRunner().invoke(main, list(args), input=stdin)
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        f"a traceback: {result.exception!r}"
    return result


def nested(depth: int) -> str:
    return '{"role": "user", "content": ' + "[" * depth + "]" * depth + "}"


@pytest.mark.parametrize("depth", DEEP)
@pytest.mark.parametrize("command", [
    ["append", "--store", "memory://", "--scope", "global", "--key", "k"],
    ["write", "--store", "memory://", "--scope", "global", "--key", "k"],
    ["normalize"],
])
def test_json_nested_too_deep_is_a_message(command: list[str], depth: int) -> None:
    for via_stdin in (False, True):
        done = cli(*command, stdin=nested(depth)) if via_stdin else \
            cli(*command, nested(depth))
        assert done.exit_code == 1, done.output
        assert "nested deeper than 102 levels" in done.stderr


def test_json_at_the_limit_is_still_accepted_by_normalize() -> None:
    done = cli("normalize", json.dumps([{"role": "user", "content": [[[]]]}]))
    assert done.exit_code == 0 and json.loads(done.stdout)["dropped"] == 0


@pytest.mark.skipif(importlib.util.find_spec("redis") is None, reason="redis-py not installed")
def test_misspelled_redis_option_lists_the_known_ones() -> None:
    done = cli("read", "--store", "redis://127.0.0.1:6379/15?prefx=a", "--scope", "global",
               "--key", "k")
    assert done.exit_code == 1
    assert "unknown option 'prefx'" in done.stderr
    assert "known options: prefix, lock_ttl," in done.stderr
    assert "AbstractConnection" not in done.stderr  # no redis-py internals


@pytest.mark.parametrize(("scope", "option"), [("workflow", "--workflow"),
                                               ("pipeline", "--pipeline"),
                                               ("execution", "--execution")])
def test_context_scope_without_its_id_warns_about_the_shared_bucket(
        tmp_path: Path, scope: str, option: str) -> None:
    where = ["--store", f"sqlite:///{tmp_path / 'w.db'}", "--scope", scope, "--key", "k"]
    done = cli("write", *where, '"v"')
    assert done.exit_code == 0 and json.loads(done.stdout)["resolved_scope_id"] == ""
    assert f'--scope {scope} without a usable {option} uses the shared bucket ""' in done.stderr
    assert json.loads(cli("read", *where, option, "  ").stdout)["value"] == "v"  # blank: shared
    done = cli("read", *where, option, "x1")
    assert done.exit_code == 0 and done.stderr == ""
    assert json.loads(done.stdout)["found"] is False


def test_global_scope_never_warns(tmp_path: Path) -> None:
    done = cli("write", "--store", f"sqlite:///{tmp_path / 'g.db'}", "--scope", "global",
               "--key", "k", '"v"')
    assert done.exit_code == 0 and done.stderr == ""


def test_history_of_a_plain_value_is_a_conflict_like_append(backend: Backend) -> None:
    if not backend.persistent:
        pytest.skip("memory:// lives in one process; the CLI opens a new one per command")
    where = ["--store", backend.url, "--scope", "user", "--user", "u-conflict", "--key", "v"]
    assert cli("write", *where, '{"a": 1}').exit_code == 0
    appended = cli("append", *where, '{"role": "user", "content": "x"}')
    history = cli("history", *where)
    assert appended.exit_code == history.exit_code == 5  # the conflict code
    assert appended.stderr == history.stderr == \
        "Error: key 'v' holds a plain value, not a conversation\n"
    assert cli("history", *where, "--last", "0").exit_code == 5  # the key's kind decides
    empty = ["--store", backend.url, "--scope", "user", "--user", "u-conflict", "--key", "e"]
    assert cli("append", *empty, "[]").exit_code == 0
    assert json.loads(cli("history", *empty).stdout)["messages"] == []  # empty, not a value
    for key in ("v", "e"):
        cli("delete", "--store", backend.url, "--scope", "user", "--user", "u-conflict",
            "--key", key)


def _commands(group: click.Group, prefix: str = "") -> list[tuple[str, click.Command]]:
    found: list[tuple[str, click.Command]] = []
    for name, command in sorted(group.commands.items()):
        found.append((prefix + name, command))
        if isinstance(command, click.Group):
            found += _commands(command, f"{prefix}{name} ")
    return found


def test_every_option_of_every_command_has_help() -> None:
    missing = [f"flowmem {name} {param.opts[0]}" for name, command in _commands(main)
               for param in command.params
               if isinstance(param, click.Option) and not param.help]
    assert missing == []
    for name, _ in _commands(main):
        done = cli(*name.split(), "--help")
        assert done.exit_code == 0 and "Usage:" in done.stdout


@pytest.mark.parametrize("args", [
    ["append", "--store", "memory://", "--scope", "global", "--key", "k", "-"],
    ["write", "--store", "memory://", "--scope", "global", "--key", "k"],
    ["normalize"],
])
@pytest.mark.processes
def test_real_process_deep_json_on_stdin(args: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "flowmem.cli", *args], input=nested(50_000),
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and "nested deeper" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.processes
def test_real_process_unknown_scope_and_missing_key() -> None:
    base = [sys.executable, "-m", "flowmem.cli", "read", "--store", "memory://"]
    for extra, says in ((["--scope", "team", "--key", "k"], "Invalid value for '--scope'"),
                        (["--scope", "global"], "Missing option '--key'")):
        done = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=60,
                              check=False)
        assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr
