"""A key holds a value or a conversation: writing a value over a conversation is
KeyConflict (409 key_conflict, CLI exit 5 with one line) and changes nothing;
replacing is explicit (delete first, ``replace=True``, ``--replace``).

The store-level check runs on every backend in the conformance suite
(``test_a_value_over_a_conversation_is_a_key_conflict``); here the three doors,
on real files and a real ``flowmem`` process."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from flowmem import ExecutionContext, KeyConflict, Memory
from flowmem.cli._exit import CONFLICT, OK
from server_support import flowmem, make_world

ALICE = ExecutionContext(user_id="alice")
TURNS = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def _env() -> dict[str, str]:
    src = str(Path(__file__).parents[2] / "src")
    return {**os.environ, "PYTHONPATH": src}


def test_memory_write_over_a_conversation_is_a_conflict(tmp_path: Path) -> None:
    with Memory.from_url(f"sqlite:///{tmp_path / 'k.db'}") as memory:
        memory.append("user", "chat", TURNS, context=ALICE)
        with pytest.raises(KeyConflict, match="holds a conversation"):
            memory.write("user", "chat", {"a": 1}, context=ALICE)
        with pytest.raises(KeyConflict):
            memory.write("user", "chat", {"a": 1}, context=ALICE, idempotency_key="k1")
        assert len(memory.history("user", "chat", context=ALICE).messages) == 2
        # the explicit act: replace=True, in one step
        assert memory.write("user", "chat", {"a": 1}, context=ALICE, replace=True).ok
        assert memory.read("user", "chat", context=ALICE).value == {"a": 1}
        # and the reverse stays a conflict until the key is deleted
        with pytest.raises(KeyConflict):
            memory.append("user", "chat", TURNS, context=ALICE)
        assert memory.delete("user", "chat", context=ALICE).found
        assert memory.append("user", "chat", TURNS, context=ALICE).count == 2


@pytest.mark.processes
def test_cli_write_over_a_conversation_exits_5_and_keeps_it(tmp_path: Path) -> None:
    where = ["--store", f"sqlite:///{tmp_path / 'c.db'}", "--scope", "user", "--key", "chat",
             "--user", "alice"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(flowmem(*args), capture_output=True, text=True, env=_env(),
                              timeout=60)

    assert run("append", *where, json.dumps(TURNS)).returncode == OK
    refused = run("write", *where, '{"a": 1}')
    assert refused.returncode == CONFLICT, refused
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "holds a conversation" in lines[0], refused.stderr
    history = run("history", *where)
    assert history.returncode == OK and len(json.loads(history.stdout)["messages"]) == 2
    replaced = run("write", *where, "--replace", '{"a": 1}')
    assert replaced.returncode == OK, replaced.stderr
    assert json.loads(run("read", *where).stdout)["value"] == {"a": 1}


@pytest.mark.server
def test_http_write_over_a_conversation_is_409_and_keeps_it() -> None:
    world = make_world()
    body = {"scope": "user", "key": "chat"}
    assert world.call("owner", "POST", "/v1/memory/append",
                      {**body, "messages": TURNS}).status_code == 200
    for headers in ({}, {"Idempotency-Key": "w1"}):
        response = world.client.post("/v1/memory/write", json={**body, "value": {"a": 1}},
                                     headers={**world.headers("owner"), **headers})
        assert response.status_code == 409, response.text
        assert response.json()["error_code"] == "key_conflict"
    history = world.call("owner", "POST", "/v1/memory/history", body)
    assert len(history.json()["data"]["messages"]) == 2
    replaced = world.call("owner", "POST", "/v1/memory/write",
                          {**body, "value": {"a": 1}, "replace": True})
    assert replaced.status_code == 200, replaced.text
    read = world.call("owner", "POST", "/v1/memory/read", body)
    assert read.json()["data"]["value"] == {"a": 1}


@pytest.mark.server
def test_reset_removes_keys_from_the_top_of_the_code_point_range(tmp_path: Path) -> None:
    world = make_world(f"sqlite:///{tmp_path / 'reset.db'}")
    sid = world.session_id
    names = ["notes", "\U0010ffff", "\U0010ffffz", "\U0010ffff\U0010ffff"]
    for name in names:
        written = world.call("owner", "POST", "/v1/memory/write",
                             {"scope": "session", "key": name, "value": 1, "session_id": sid})
        assert written.status_code == 200, written.text
    assert world.call("owner", "POST", f"/v1/sessions/{sid}/reset").status_code == 200
    for name in names:
        read = world.call("owner", "POST", "/v1/memory/read",
                          {"scope": "session", "key": name, "session_id": sid})
        assert read.json()["data"]["found"] is False, name


@pytest.mark.server
def test_a_replayed_write_says_so() -> None:
    world = make_world()
    headers = {**world.headers("owner"), "Idempotency-Key": "w-replay"}
    body = {"scope": "user", "key": "prefs", "value": {"lang": "fr"}}
    first = world.client.post("/v1/memory/write", json=body, headers=headers)
    assert first.status_code == 200 and "Idempotent-Replayed" not in first.headers
    again = world.client.post("/v1/memory/write", json=body, headers=headers)
    assert again.status_code == 200, again.text
    assert again.headers.get("Idempotent-Replayed") == "true"


@pytest.mark.server
def test_healthz_reports_the_store(tmp_path: Path) -> None:
    path = tmp_path / "health.db"
    world = make_world(f"sqlite:///{path}", seed=False)
    assert world.call("anonymous", "GET", "/healthz").status_code == 200
    for suffix in ("", "-wal", "-shm"):  # the database deleted under the service
        if os.path.exists(f"{path}{suffix}"):
            os.unlink(f"{path}{suffix}")
    down = world.call("anonymous", "GET", "/healthz")
    assert down.status_code == 503, down.text
    assert down.json()["error_code"] == "store_unavailable"
