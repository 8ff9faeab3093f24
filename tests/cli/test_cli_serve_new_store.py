"""``flowmem serve`` on a SQLite file that does not exist says, on start, that it is
creating a new, empty store (the tokens of a deleted file are not there)."""

from __future__ import annotations

from pathlib import Path

import pytest

from server_support import free_port, serving

pytestmark = [pytest.mark.processes, pytest.mark.server]


def test_serve_warns_when_it_creates_the_store(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parents[2] / "src"))
    path = tmp_path / "gone.db"
    store = f"sqlite:///{path}"
    output: list[str] = []
    with serving(store, free_port(), output=output) as client:
        assert client.get("/healthz").status_code == 200
    assert "did not exist" in output[0] and "NEW, EMPTY store" in output[0], output
    assert path.exists()
    again: list[str] = []  # the file exists now: no warning
    with serving(store, free_port(), output=again) as client:
        assert client.get("/healthz").status_code == 200
    assert "did not exist" not in again[0], again
