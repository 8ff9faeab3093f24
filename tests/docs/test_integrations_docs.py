"""docs/integrations.md: one example per framework and one of the call-id policy (each runs in
tests/test_docs_examples.py); importing flowmem imports no framework."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def test_one_example_per_framework_and_the_call_id_policy() -> None:
    assert len(BLOCKS) == 4


def test_importing_flowmem_imports_no_framework() -> None:
    code = ("import sys, flowmem, flowmem.formats, flowmem.integrations\n"
            "bad = [m for m in ('langchain_core', 'langgraph', 'agents', 'langchain')"
            " if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_framework_names_the_extra() -> None:
    code = ("import sys\n"
            "sys.modules['agents'] = None\n"
            "import flowmem\n"
            "try:\n"
            "    import flowmem.integrations.agents\n"
            "except flowmem.MissingDependency as exc:\n"
            "    assert exc.extra == 'agents', exc\n"
            "else:\n"
            "    raise SystemExit('no MissingDependency')\n")
    subprocess.run([sys.executable, "-c", code], check=True)
