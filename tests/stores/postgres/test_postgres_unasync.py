"""The blocking PostgreSQL store is generated from the asyncio one (scripts/unasync.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "unasync.py"


def _unasync() -> ModuleType:
    spec = importlib.util.spec_from_file_location("unasync_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_checked_in_blocking_store_is_what_the_script_generates() -> None:
    unasync = _unasync()
    expected, unused = unasync.generate()
    assert unused == []
    assert unasync.TARGET.read_text(encoding="utf-8") == expected
    assert expected.startswith("# GENERATED FILE")


def test_substitutions_sort_changed_imports_and_realign_continuations() -> None:
    unasync = _unasync()
    used: set[int] = set()
    lines = unasync.unasync_lines([
        "from collections.abc import AsyncIterator, Callable, Sequence\n",
        "async def f(a: int,\n",
        "            b: int) -> None:\n",
        "    await g(x,\n",
        "            y)\n",
        "    await adrive(\n",
        "        z)\n",
    ], used)
    assert lines == [
        "from collections.abc import Callable, Iterator, Sequence\n",
        "def f(a: int,\n",
        "      b: int) -> None:\n",
        "    g(x,\n",
        "      y)\n",
        "    drive(\n",
        "        z)\n",
    ]


def test_check_fails_on_a_stale_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    unasync = _unasync()
    stale = tmp_path / "_sync.py"
    stale.write_text("# edited by hand\n", encoding="utf-8")
    monkeypatch.setattr(unasync, "TARGET", stale)
    monkeypatch.setattr(unasync, "ROOT", tmp_path)
    assert unasync.main(["--check"]) == 1
    assert "stale" in capsys.readouterr().err
    assert unasync.main([]) == 0
    assert unasync.main(["--check"]) == 0
