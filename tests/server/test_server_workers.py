"""``flowmem serve --workers N``: several processes on one port and one store, every rule
kept (the stores serialize across processes), a revoke seen by all, nothing shared that
cannot be (memory://, access hooks)."""

from __future__ import annotations

import json
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from flowmem.access import Level
from flowmem.cli._main import main
from flowmem.errors import InvalidInput
from flowmem.server import Limits, Settings
from flowmem.server._workers import settings_from_spec, worker_spec
from server_support import flowmem, free_port, serving


def test_the_settings_cross_into_a_worker_unchanged() -> None:
    settings = Settings(limits=Limits(max_read_bytes=1234, max_content_chars=99),
                        session_window=40, page_size=20, echo=7, max_viewers=3,
                        read_timeout=2.5, allowed_hosts=("localhost", "a.example"),
                        anonymous=Level.READ, rate_limit=0.0, burst=9, metrics_public=True,
                        fast_turns=False)
    spec = worker_spec("sqlite:///x.db", settings)
    assert json.loads(spec)["store"] == "sqlite:///x.db"
    assert settings_from_spec(json.loads(spec)) == settings
    assert settings_from_spec(json.loads(worker_spec("sqlite:///x.db", Settings()))) \
        == Settings()


def test_what_one_process_cannot_hand_to_another_is_refused() -> None:
    with pytest.raises(InvalidInput, match="memory://"):
        worker_spec("memory://", Settings())
    with pytest.raises(InvalidInput, match="hooks"):
        worker_spec("sqlite:///x.db", Settings(hooks=(lambda *_: None,)))


def test_the_cli_refuses_workers_on_memory_before_serving() -> None:
    result = CliRunner().invoke(main, ["serve", "--store", "memory://", "--workers", "2"])
    assert result.exit_code != 0
    assert "memory://" in result.output and "Traceback" not in result.output
    assert "serving" not in result.output
    bad = CliRunner().invoke(main, ["serve", "--workers", "0"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output


def _token(store: str) -> str:
    done = subprocess.run(flowmem("token", "create", "--user", "ana", "--store", store),
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


def _workers(pid: int) -> list[int]:
    """The worker processes among a process's children (not multiprocessing's tracker)."""
    children = [int(child) for task in Path(f"/proc/{pid}/task").iterdir()
                for child in (task / "children").read_text().split()]
    return [child for child in children
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes()]


def test_two_workers_keep_every_append_once_and_see_a_revoke(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'w.db'}"
    secret = _token(store)
    started: list[subprocess.Popen[bytes]] = []
    with serving(store, free_port(), "--workers", "2", "--rate-limit", "0",
                 started=started) as http:
        assert len(_workers(started[0].pid)) == 2  # two worker processes
        auth = {"Authorization": f"Bearer {secret}"}
        sessions = [http.post("/v1/sessions", json={"title": f"s{i}"}, headers=auth)
                    .json()["data"]["id"] for i in range(4)]

        def drive(sid: str) -> list[int]:
            with httpx.Client(base_url=str(http.base_url), headers=auth, timeout=30) as own:
                counts = []
                for turn in range(12):
                    body = {"messages": [{"role": "user", "content": f"{sid} {turn}"}]}
                    answer = own.post(f"/v1/sessions/{sid}/turns", json=body).json()["data"]
                    counts.append(answer["count"])
                    again = own.post(f"/v1/sessions/{sid}/turns", json=body,
                                     headers={"Prefer": "return=minimal"}).json()["data"]
                    counts.append(again["count"])  # a repeat user turn is a new message
                return counts

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(drive, sessions * 2))
        for sid in sessions:
            page = http.get(f"/v1/sessions/{sid}/messages", params={"limit": 100},
                            headers=auth).json()
            assert page["pagination"]["total"] == 48  # 2 drivers × 12 turns × 2 appends
            assert len({entry["position"] for entry in page["data"]["messages"]}) == 48
        assert all(counts == sorted(counts) for counts in results)  # MEM-14, per driver

        listed = subprocess.run(flowmem("token", "list", "--json", "--store", store),
                                capture_output=True, text=True, check=True)
        token_id = json.loads(listed.stdout.splitlines()[0])["id"]
        subprocess.run(flowmem("token", "revoke", token_id, "--store", store), check=True,
                       capture_output=True)
        for _ in range(12):  # announced through the store: every worker refuses at once
            with httpx.Client(base_url=str(http.base_url), headers=auth) as fresh:
                assert fresh.get(f"/v1/sessions/{sessions[0]}").status_code == 401
    assert started[0].returncode in (0, -signal.SIGTERM)
