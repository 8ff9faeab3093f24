"""The ONE exit-code table of the CLI (docs/cli.md), for every command, and its
one-line errors; stored text printed as text (escapes shown, markup not read);
export files private; sessions listed oldest first; ``sessions reset``."""

from __future__ import annotations

import os
import re
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from flowmem.cli._exit import CONFLICT, ERROR, OK, REFUSED, STORE_UNAVAILABLE, USAGE
from flowmem.cli._main import main
from server_support import flowmem

HOSTILE = "\x1b[2J\x1b]0;pwned\x07\x1b]52;c;ZXZpbA==\x07\u202eevil"


def cli(*args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=stdin)


def _one_line(result: Result) -> None:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr


@pytest.fixture
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'f.db'}"


def test_the_docs_publish_the_table() -> None:
    text = (Path(__file__).parents[2] / "docs" / "cli.md").read_text()
    published = dict(re.findall(r"^\| `(\d)` \| ([^|]+) \|$", text, re.M))
    assert sorted(int(c) for c in published) == sorted(
        {OK, ERROR, USAGE, REFUSED, STORE_UNAVAILABLE, CONFLICT})


def test_every_command_answers_with_the_table(store: str, tmp_path: Path) -> None:
    where = ["--store", store, "--scope", "user", "--user", "u", "--key"]
    sid = cli("sessions", "create", "--owner", "alice", "--store", store).stdout.strip()
    usage = [  # code 2: a missing or malformed option or argument
        ["read"], ["write", *where, "k", "{not json"], ["append", *where, "c", "{"],
        ["history", *where, "c", "--last", "x"], ["delete"], ["normalize", "{"],
        ["export"], ["transcript"], ["serve", "--port", "-1"],
        ["token", "create", "--user", "0", "--store", store],
        ["sessions", "create", "--owner", "0", "--store", store],
        ["sessions", "list", "--shared", "--store", store],
        ["sessions", "show"], ["sessions", "stop"], ["sessions", "reset"],
        ["sessions", "viewers", "add", sid, "0", "--store", store],
        ["token", "revoke"], ["nope"], ["import", str(tmp_path / "missing.jsonl")]]
    for args in usage:
        result = cli(*args)
        assert result.exit_code == USAGE, (args, result.exit_code, result.output)
        _one_line(result)
        assert "--help" in result.stderr
    refused = [["read", "--store", store, "--scope", "user", "--key", "k"],
               ["write", "--store", store, "--scope", "session", "--key", "k", "1"],
               ["append", "--store", store, "--scope", "user", "--user", "0", "--key", "c",
                '{"role": "user", "content": "x"}'],
               ["history", "--store", store, "--scope", "session", "--key", "c"],
               ["delete", "--store", store, "--scope", "user", "--key", "k"],
               ["transcript", "--store", store, "--scope", "user", "--key", "c"],
               ["export", "--store", store, "--scope", "user"]]
    for args in refused:
        result = cli(*args)
        assert result.exit_code == REFUSED, (args, result.exit_code, result.output)
    errors = [["sessions", "show", "nope", "--store", store],
              ["sessions", "stop", "nope", "--store", store],
              ["sessions", "reset", "nope", "--store", store],
              ["token", "revoke", "0123456789abcdef", "--store", store],
              ["transcript", "nope", "--store", store],
              ["token", "create", "--user", "a", "--store", "memory://"]]
    for args in errors:
        result = cli(*args)
        assert result.exit_code == ERROR, (args, result.exit_code, result.output)
        _one_line(result)
    assert cli("write", *where, "v", "1").exit_code == OK
    conflict = cli("append", *where, "v", '{"role": "user", "content": "x"}')
    assert conflict.exit_code == CONFLICT
    _one_line(conflict)


def test_a_store_that_cannot_be_written_is_the_unavailable_code(tmp_path: Path) -> None:
    path = tmp_path / "ro.db"
    assert cli("write", "--store", f"sqlite:///{path}", "--scope", "global", "--key", "k",
               "1").exit_code == OK
    result = cli("write", "--store", f"sqlite:///{path}?mode=ro", "--scope", "global",
                 "--key", "k", "2")
    assert result.exit_code == STORE_UNAVAILABLE, result.output
    _one_line(result)


@pytest.mark.processes
def test_serve_on_a_port_in_use_is_an_error_not_a_refusal(store: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(flowmem("serve", "--store", store, "--port", str(port)),
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == ERROR, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and str(port) in errors[0], done.stderr


@pytest.mark.processes
def test_append_says_what_it_waits_for_on_a_terminal(store: str) -> None:
    leader, follower = os.openpty()
    process = subprocess.Popen(flowmem("append", "--store", store, "--scope", "user",
                                       "--user", "u", "--key", "c"),
                               stdin=follower, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    os.close(follower)
    time.sleep(1.0)
    os.write(leader, b'{"role": "user", "content": "x"}\n\x04')
    _, err = process.communicate(timeout=60)
    os.close(leader)
    assert process.returncode == OK, err
    assert b"reading" in err and b"stdin" in err


def test_stored_escapes_are_shown_not_obeyed(store: str) -> None:
    sid = cli("sessions", "create", "--owner", HOSTILE, "--title", HOSTILE,
              "--store", store).stdout.strip()
    listed = cli("sessions", "list", "--store", store).stdout
    assert "\x1b" not in listed and "\u202e" not in listed and "\\x1b]52" in listed
    cli("append", "--store", store, "--scope", "session", "--session", sid, "--key",
        "transcript", f'{{"role": "user", "content": {HOSTILE!r}}}'.replace("'", '"'))
    for args in (["transcript", sid], ["transcript", sid, "--color"]):
        shown = cli(*args, "--store", store).stdout
        assert "\x1b]" not in shown and "\x1b[2J" not in shown and "\u202e" not in shown
        assert "\\x1b]0;pwned" in shown
    tokens = cli("token", "create", "--user", HOSTILE, "--store", store)
    assert tokens.exit_code == OK
    assert "\x1b" not in cli("token", "list", "--store", store).stdout


def test_a_title_is_text_never_markup(store: str) -> None:
    for title in ("[/bold] x", "[link=https://evil.example]click[/link]", "[red]"):
        sid = cli("sessions", "create", "--owner", "alice", "--title", title,
                  "--store", store).stdout.strip()
        shown = cli("transcript", sid, "--color", "--store", store)
        assert shown.exit_code == OK, shown.output
        assert title in shown.stdout and "\x1b]8;" not in shown.stdout


def test_an_export_is_private(store: str, tmp_path: Path) -> None:
    cli("write", "--store", store, "--scope", "user", "--user", "u", "--key", "k", "1")
    target = tmp_path / "out.jsonl"
    target.write_text("")
    target.chmod(0o644)
    assert cli("export", "--store", store, "--scope", "user", "--user", "u",
               "-o", str(target)).exit_code == OK
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    fresh = tmp_path / "fresh.jsonl"
    assert cli("export", "--store", store, "--scope", "user", "--user", "u",
               "-o", str(fresh)).exit_code == OK
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o600


def test_sessions_are_listed_oldest_first_and_reset_works(store: str) -> None:
    made = [cli("sessions", "create", "--owner", "alice", "--title", f"t{i}",
                "--store", store).stdout.strip() for i in range(6)]
    listed = [line.split()[0] for line in
              cli("sessions", "list", "--store", store).stdout.splitlines()[1:]]
    assert listed == made
    assert [line.split()[0] for line in cli("sessions", "list", "--offset", "2", "--limit", "2",
                                            "--store", store).stdout.splitlines()[1:]] == made[2:4]
    sid = made[0]
    cli("append", "--store", store, "--scope", "session", "--session", sid, "--key",
        "transcript", '{"role": "user", "content": "x"}')
    assert cli("sessions", "stop", sid, "--store", store).exit_code == OK
    assert "reset" in cli("sessions", "stop", "--help").stdout
    reset = cli("sessions", "reset", sid, "--store", store)
    assert reset.exit_code == OK and '"idle"' in reset.stdout
    shown = cli("sessions", "show", sid, "--store", store).stdout
    assert '"messages": 0' in shown or '"messages": null' in shown
