"""Only flowmem's own databases: a path is checked before anything is written.

A file that is not SQLite, another application's SQLite database and a
flowmem database of an unknown (newer) schema are refused with one sentence
(:class:`~flowmem.SchemaError`, a ``StoreError``); the file is left byte for
byte and nothing is left beside it (no ``.lock``, ``-wal``, ``-shm``). The CLI
answers one line, and ``flowmem serve`` refuses to start."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from flowmem import Memory, SchemaError
from flowmem.stores.sqlite._schema import APPLICATION_ID
from server_support import flowmem, free_port


def _text(path: Path) -> None:
    path.write_text("my notes\nnot a database\n")


def _other_application(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (x)")
        db.execute("INSERT INTO t VALUES (1)")
    db.close()


def _newer_flowmem(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        db.execute("PRAGMA user_version = 99")
        db.execute("CREATE TABLE kv (x)")
    db.close()


KINDS: dict[str, tuple[Callable[[Path], None], str]] = {
    "text": (_text, "is not a SQLite database"),
    "other-application": (_other_application, "is not a flowmem database"),
    "newer-flowmem": (_newer_flowmem, "schema version 99"),
}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(Path(__file__).parents[3] / "src")}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_foreign_file_is_refused_and_left_alone(tmp_path: Path, kind: str) -> None:
    make, says = KINDS[kind]
    path = tmp_path / "notes.db"
    make(path)
    before = path.read_bytes()
    with pytest.raises(SchemaError, match=says) as refused:
        Memory.from_url(f"sqlite:///{path}")
    assert len(str(refused.value).splitlines()) == 1
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]  # nothing beside it


@pytest.mark.processes
def test_the_cli_and_serve_refuse_a_text_file_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    _text(path)
    before = path.read_bytes()
    store = f"sqlite:///{path}"
    for args in (("read", "--store", store, "--scope", "user", "--user", "a", "--key", "k"),
                 ("serve", "--store", store, "--port", str(free_port()))):
        done = subprocess.run(flowmem(*args), env=_env(), capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 1, (args[0], done)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "is not a SQLite database" in lines[0], done.stderr
        assert "Traceback" not in done.stderr and "serving" not in done.stderr
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
