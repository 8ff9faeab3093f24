"""The README's Python examples run as written (tested docs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_readme_example_runs(index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MEM-3, MEM-5, MEM-6, MEM-10, MEM-14 as the README shows them."""
    monkeypatch.chdir(tmp_path)
    exec(compile(python_blocks()[index], f"README.md[python {index}]", "exec"), {})
