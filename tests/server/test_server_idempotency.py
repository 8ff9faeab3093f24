"""``Idempotency-Key`` over HTTP (#10): a retried write changes nothing and answers the
first outcome; a reused key with another body is 422; keys are per caller. And the fault
the issue found: ``flowmem serve`` killed (``kill -9``) under 8 clients that retry with
the header — stored equals acknowledged, duplicates 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from figures import Figure
from server_support import STARTUP, World, flowmem, free_port, make_world


@pytest.fixture
def world() -> World:
    return make_world(seed=False)


def _call(world: World, role: str, path: str, body: Any, key: str | None) -> Any:
    headers = {**world.headers(role), "Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    return world.client.post(path, content=json.dumps(body), headers=headers)


def test_a_retried_append_is_stored_once_and_answers_the_first_outcome(world: World) -> None:
    body = {"scope": "user", "key": "chat", "messages": [{"role": "user", "content": "hi"}]}
    first = _call(world, "owner", "/v1/memory/append", body, "k-1")
    again = _call(world, "owner", "/v1/memory/append", body, "k-1")
    assert first.status_code == again.status_code == 200
    assert "Idempotent-Replayed" not in first.headers
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["data"]["appended"] == first.json()["data"]["appended"] == 1
    page = _call(world, "owner", "/v1/memory/history", {"scope": "user", "key": "chat"}, None)
    assert page.json()["pagination"]["total"] == 1


def test_a_reused_key_with_another_body_is_422_and_changes_nothing(world: World) -> None:
    body = {"scope": "user", "key": "chat", "messages": [{"role": "user", "content": "a"}]}
    _call(world, "owner", "/v1/memory/append", body, "k-2")
    other = {**body, "messages": [{"role": "user", "content": "b"}]}
    refused = _call(world, "owner", "/v1/memory/append", other, "k-2")
    assert refused.status_code == 422
    assert refused.json()["error_code"] == "idempotency_key_reused"
    assert "k-2" not in refused.text and "http:" not in refused.text  # no internal key
    page = _call(world, "owner", "/v1/memory/history", {"scope": "user", "key": "chat"}, None)
    assert [m["message"]["content"] for m in page.json()["data"]["messages"]] == ["a"]


def test_keys_belong_to_their_caller(world: World) -> None:
    """Two callers choosing the same key never replay each other's answer."""
    for role in ("owner", "other"):
        body = {"scope": "user", "key": "chat", "messages": [{"role": "user", "content": role}]}
        answer = _call(world, role, "/v1/memory/append", body, "same")
        assert answer.status_code == 200 and "Idempotent-Replayed" not in answer.headers


def test_write_delete_and_turns_take_the_header(world: World) -> None:
    write = {"scope": "user", "key": "v", "value": 1}
    assert _call(world, "owner", "/v1/memory/write", write, "w").status_code == 200
    _call(world, "owner", "/v1/memory/write", {**write, "value": 2}, None)
    replayed = _call(world, "owner", "/v1/memory/write", write, "w")  # no effect
    assert replayed.status_code == 200 and replayed.headers["Idempotent-Replayed"] == "true"
    read = _call(world, "owner", "/v1/memory/read", {"scope": "user", "key": "v"}, None)
    assert read.json()["data"]["value"] == 2
    sid = world.new_session("owner", "t")
    turn = {"messages": [{"role": "user", "content": "once"}]}
    for _ in range(3):
        answer = _call(world, "owner", f"/v1/sessions/{sid}/turns", turn, "t-1")
        assert answer.status_code == 200
    assert answer.headers["Idempotent-Replayed"] == "true"
    listed = world.call("owner", "GET", f"/v1/sessions/{sid}/messages")
    assert listed.json()["pagination"]["total"] == 1


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_a_retried_delete_answers_the_first_outcome_marked_replayed(tmp_path: Path,
                                                                    store: str) -> None:
    world = make_world("memory://" if store == "memory" else f"sqlite:///{tmp_path / 'd.db'}",
                       seed=False)
    value = {"scope": "user", "key": "v", "value": 1}
    _call(world, "owner", "/v1/memory/write", value, None)
    delete = {"scope": "user", "key": "v"}
    first = _call(world, "owner", "/v1/memory/delete", delete, "d-1")
    again = _call(world, "owner", "/v1/memory/delete", delete, "d-1")
    assert first.status_code == again.status_code == 200
    assert "Idempotent-Replayed" not in first.headers
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == first.json() and first.json()["data"]["found"] is True
    # written again since: a late retry still changes nothing and answers the first outcome
    _call(world, "owner", "/v1/memory/write", {**value, "value": 2}, None)
    late = _call(world, "owner", "/v1/memory/delete", delete, "d-1")
    assert (late.status_code, late.headers["Idempotent-Replayed"]) == (200, "true")
    assert late.json() == first.json()
    read = _call(world, "owner", "/v1/memory/read", delete, None)
    assert read.json()["data"]["value"] == 2
    # another key is another delete; the same key for another storage key is another request
    fresh = _call(world, "owner", "/v1/memory/delete", delete, "d-2")
    elsewhere = _call(world, "owner", "/v1/memory/delete", {**delete, "key": "w"}, "d-1")
    for answer, found in ((fresh, True), (elsewhere, False)):
        assert answer.status_code == 200 and "Idempotent-Replayed" not in answer.headers
        assert answer.json()["data"]["found"] is found


@pytest.mark.parametrize("bad", ["", "x" * 256, "é", "a b"])
def test_a_malformed_key_is_400(world: World, bad: str) -> None:
    body = {"scope": "user", "key": "chat", "messages": [{"role": "user", "content": "x"}]}
    headers = {**world.headers("owner"), "Content-Type": "application/json",
               "Idempotency-Key": bad}
    answer = world.client.post("/v1/memory/append", content=json.dumps(body).encode(),
                               headers={k: v.encode() if k == "Idempotency-Key" else v
                                        for k, v in headers.items()})
    assert answer.status_code == 400
    assert answer.json()["error_code"] == "invalid_field"


# -- flowmem serve killed under retrying clients ------------------------------------------

def _start(store: str, port: int) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(flowmem("serve", "--store", store, "--port", str(port),
                                       "--log-level", "warning", "--rate-limit", "0"),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + STARTUP
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.05)
    process.kill()
    raise AssertionError("flowmem serve did not come up")


class Client(threading.Thread):
    """Appends numbered turns to its own session; retries each with its key until answered."""

    def __init__(self, base: str, token: str, session: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.base, self.token, self.session, self.stop = base, token, session, stop
        self.acknowledged: list[str] = []
        self.retries = 0

    def run(self) -> None:
        with httpx.Client(base_url=self.base, timeout=5) as http:
            n = 0
            while not self.stop.is_set():
                text = f"{self.session[:6]}-{n}"
                self._send(http, text)
                n += 1

    def _send(self, http: httpx.Client, text: str) -> None:
        headers = {"Authorization": f"Bearer {self.token}", "Idempotency-Key": text}
        body = {"messages": [{"role": "user", "content": text}]}
        while True:
            try:
                answer = http.post(f"/v1/sessions/{self.session}/turns", json=body,
                                   headers=headers)
                if answer.status_code == 200:
                    self.acknowledged.append(text)
                    return
            except httpx.TransportError:
                pass
            self.retries += 1
            time.sleep(0.05)


def _more_acknowledged(clients: list[Client], count: int) -> None:
    """Wait until the clients have ``count`` more turns acknowledged than now."""
    target = sum(len(c.acknowledged) for c in clients) + count
    deadline = time.monotonic() + 60
    while sum(len(c.acknowledged) for c in clients) < target:
        assert time.monotonic() < deadline, "the clients stopped getting answers"
        time.sleep(0.01)


def test_serve_killed_under_retrying_clients_stores_each_turn_once(tmp_path: Path,
        figure: Figure) -> None:
    store = f"sqlite:///{tmp_path / 'kill.db'}"
    token = subprocess.run(flowmem("token", "create", "--user", "alice", "--store", store),
                           capture_output=True, text=True, check=True).stdout.strip()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = _start(store, port)
    auth = {"Authorization": f"Bearer {token}"}
    sessions = [httpx.post(f"{base}/v1/sessions", json={"title": f"c{i}"}, headers=auth)
                .json()["data"]["id"] for i in range(8)]
    stop = threading.Event()
    clients = [Client(base, token, sid, stop) for sid in sessions]
    for client in clients:
        client.start()
    kills = 0
    try:
        for _ in range(2):
            _more_acknowledged(clients, 24)  # the clients are well under way: kill mid-stream
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
            kills += 1
            process = _start(store, port)
        _more_acknowledged(clients, 24)  # and appending again after the last restart
    finally:
        stop.set()
        for client in clients:
            client.join(30)
        process.send_signal(signal.SIGTERM)
        process.wait(15)
    process = _start(store, port)
    try:
        stored: dict[str, list[str]] = {}
        for sid in sessions:
            stored[sid] = _transcript(base, auth, sid)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(15)
    acknowledged = sum(len(c.acknowledged) for c in clients)
    kept = sum(len(v) for v in stored.values())
    duplicates = sum(len(v) - len(set(v)) for v in stored.values())
    figure(f"\nserve kill -9 x{kills} under 8 clients: acknowledged {acknowledged}, stored {kept}, "
          f"duplicates {duplicates}, retries {sum(c.retries for c in clients)}")
    assert duplicates == 0
    for client in clients:
        assert stored[client.session] == client.acknowledged  # stored equals acknowledged
    assert kills == 2 and acknowledged > 0


def _transcript(base: str, auth: dict[str, str], sid: str) -> list[str]:
    """Every message of a session, oldest first, paged back with the ``before`` cursor."""
    texts: list[str] = []
    params: dict[str, Any] = {"limit": 100}
    while True:
        page = httpx.get(f"{base}/v1/sessions/{sid}/messages", params=params,
                         headers=auth).json()["data"]
        texts[:0] = [m["message"]["content"] for m in page["messages"]]
        if page["before"] is None:
            return texts
        params["before"] = page["before"]
