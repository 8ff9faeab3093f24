"""End to end: `flowmem serve` as a real process on temp SQLite; stop, start: nothing lost."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from server_support import flowmem, free_port, serving


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
