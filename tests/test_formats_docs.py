"""docs/formats.md's Python examples run as written (MEM-1, MEM-3, MEM-5, MEM-11)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "formats.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


@pytest.mark.parametrize("index", range(1, len(python_blocks())))
def test_formats_doc_example_runs(index: int) -> None:
    exec(compile(python_blocks()[index], f"formats.md[python {index}]", "exec"), {})


def test_the_api_summary_names_real_functions() -> None:
    from flowmem import formats

    for name in re.findall(r"formats\.(\w+)\(", python_blocks()[0]):
        assert callable(getattr(formats, name))
