"""docs/formats.md's API synopsis names real functions (every example of the docs,
this one included, runs in tests/test_docs_examples.py)."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "formats.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


def test_the_api_summary_names_real_functions() -> None:
    from flowmem import formats

    names = re.findall(r"formats\.(\w+)\(", python_blocks()[0])
    assert names
    for name in names:
        assert callable(getattr(formats, name))
