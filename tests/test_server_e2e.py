"""End to end: `flowmem serve` as a real process on temp SQLite; stop, start: nothing lost."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from server_support import free_port


def flowmem(*args: str) -> list[str]:
    script = shutil.which("flowmem")
    return [script, *args] if script else [sys.executable, "-m", "flowmem.cli", *args]


@contextmanager
def serving(store: str, port: int) -> Iterator[httpx.Client]:
    process = subprocess.Popen(flowmem("serve", "--store", store, "--port", str(port),
                                       "--log-level", "warning"),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            assert process.poll() is None, process.communicate()[0].decode()
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "flowmem serve did not come up"
            time.sleep(0.05)
        with httpx.Client(base_url=base, timeout=10) as client:
            yield client
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        # uvicorn shuts down gracefully, then re-raises the signal: -SIGTERM (or 0)
        assert code in (0, -signal.SIGTERM), process.communicate()[0].decode()


def test_serve_stop_restart_nothing_lost(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'flowmem.db'}"
    created = subprocess.run(flowmem("token", "create", "--user", "alice", "--store", store),
                             capture_output=True, text=True, check=True, env=os.environ)
    token = created.stdout.strip()
    auth = {"Authorization": f"Bearer {token}"}
    call = {"role": "assistant", "content": "",
            "tool_calls": [{"id": "c1", "type": "function",
                            "function": {"name": "weather", "arguments": "{}"}},
                           {"id": "c2", "type": "function",
                            "function": {"name": "time", "arguments": "{}"}}]}
    result = {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    port = free_port()
    with serving(store, port) as http:
        sid = http.post("/v1/sessions", json={"title": "e2e"}, headers=auth).json()["data"]["id"]

        def turn(*messages: dict[str, Any]) -> Any:
            response = http.post(f"/v1/sessions/{sid}/turns", json={"messages": list(messages)},
                                 headers=auth)
            assert response.status_code == 200, response.text
            return response.json()["data"]

        assert turn({"role": "user", "content": "weather and time?"})["appended"] == 1
        assert turn(call, result)["appended"] == 2
        assert turn(result)["appended"] == 0  # the re-fired result (MEM-1)
        healed = turn({"role": "user", "content": "thanks"})  # c2 heals (MEM-3)
        assert (healed["count"], healed["appended"]) == (5, 1)
        memory = http.post("/v1/memory/write", headers=auth,
                           json={"scope": "user", "key": "pref", "value": {"units": "metric"}})
        assert memory.json()["data"]["ok"]
        before = http.get(f"/v1/sessions/{sid}/messages", headers=auth).json()
        assert before["data"]["messages"][3]["message"]["metadata"] == {"tool_call_id": "c2",
                                                                 "healed": True}
    with serving(store, free_port()) as http:
        after = http.get(f"/v1/sessions/{sid}/messages", headers=auth).json()
        assert after == before
        assert http.get(f"/v1/sessions/{sid}", headers=auth).json()["data"]["title"] == "e2e"
        listed = http.get("/v1/sessions", headers=auth).json()["data"]
        assert [s["id"] for s in listed] == [sid]
        pref = http.post("/v1/memory/read", headers=auth,
                         json={"scope": "user", "key": "pref"}).json()["data"]
        assert pref["value"] == {"units": "metric"}
        late = http.post(f"/v1/sessions/{sid}/turns", headers=auth,
                         json={"messages": [{"role": "tool", "tool_call_id": "c2",
                                             "content": "noon"}]}).json()["data"]
        assert (late["count"], late["appended"]) == (5, 0)  # MEM-10 after a restart
