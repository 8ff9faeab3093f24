"""The ``flowmem`` command: token create (printed once, stored hashed) and serve's options."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from flowmem.access import Principal
from flowmem.cli._main import main
from flowmem.service._tokens import TokenBackend
from flowmem.stores import open_async_store


def lookup(url: str, token: str) -> Principal | None:
    """What the token stands for in the store at ``url`` (one loop opens and closes it)."""
    async def run() -> Principal | None:
        store = open_async_store(url)
        try:
            return await TokenBackend(store).lookup(token)
        finally:
            await store.aclose()

    return asyncio.run(run())


def test_token_create_prints_a_token_stored_hashed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    result = CliRunner().invoke(main, ["token", "create", "--user", "alice", "--store", url])
    assert result.exit_code == 0, result.output
    token = result.stdout.strip()
    assert token.startswith("fm_") and len(token) > 30
    assert f"token stored in {url}" in result.stderr  # says where, for `flowmem serve`
    principal = lookup(url, token)
    assert principal is not None and principal.user_id == "alice" and not principal.admin
    assert token.encode() not in (tmp_path / "m.db").read_bytes()


def test_token_create_admin_uses_flowmem_store_env(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'env.db'}"
    result = CliRunner().invoke(main, ["token", "create", "--user", "root", "--admin"],
                                env={"FLOWMEM_STORE": url})
    assert result.exit_code == 0, result.output
    principal = lookup(url, result.stdout.strip())
    assert principal is not None and principal.admin


def test_token_create_refuses_an_unusable_user(tmp_path: Path) -> None:
    for user in ("", "  ", "0"):
        result = CliRunner().invoke(main, ["token", "create", "--user", user,
                                           "--store", f"sqlite:///{tmp_path / 'u.db'}"])
        assert result.exit_code == 2 and "usable user id" in result.output  # usage, as in
        # sessions create --owner 0


def test_a_token_in_a_memory_store_is_refused_with_the_reason() -> None:
    """A memory:// token would vanish with the command: say so instead (#16)."""
    result = CliRunner().invoke(main, ["token", "create", "--user", "a", "--store", "memory://"])
    assert result.exit_code == 1 and "lives in one process" in result.output


def test_bad_store_url_is_a_clean_error() -> None:
    result = CliRunner().invoke(main, ["token", "create", "--user", "a", "--store", "nope://x"])
    assert result.exit_code != 0 and "unknown store scheme" in result.output
    result = CliRunner().invoke(main, ["serve", "--store", "nope://x"])
    assert result.exit_code != 0 and "unknown store scheme" in result.output


def test_serve_help_lists_its_options() -> None:
    result = CliRunner().invoke(main, ["serve", "--help"])
    assert result.exit_code == 0
    for option in ("--store", "--host", "--port"):
        assert option in result.output
    assert "127.0.0.1" in result.output and "8080" in result.output


def test_token_grants_expiry_list_and_revoke(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    runner = CliRunner()
    made = runner.invoke(main, ["token", "create", "--user", "svc", "--grant",
                                "workflow:support-*:write", "--expires", "12h", "--store", url])
    assert made.exit_code == 0, made.output
    token = made.output.strip()
    listed = runner.invoke(main, ["token", "list", "--json", "--store", url])
    (row,) = [json.loads(line) for line in listed.output.splitlines()]
    assert row["user_id"] == "svc" and row["grants"] == ["workflow:support-*:write"]
    assert row["expires_at"] > row["created_at"] and token not in listed.output
    assert runner.invoke(main, ["token", "revoke", row["id"], "--store", url]).exit_code == 0
    assert lookup(url, token) is None


@pytest.mark.parametrize("args", [["--grant", "user:*:read"], ["--grant", "workflow:*"],
                                  ["--expires", "soon"], ["--expires", "-1d"]])
def test_token_create_refuses_bad_grants_and_durations(args: list[str]) -> None:
    result = CliRunner().invoke(main, ["token", "create", "--user", "a", *args,
                                       "--store", "memory://"])
    assert result.exit_code != 0 and "Traceback" not in result.output


def test_serve_help_lists_the_security_options() -> None:
    result = CliRunner().invoke(main, ["serve", "--help"])
    for option in ("--anonymous", "--allowed-host", "--rate-limit", "--burst"):
        assert option in result.output
