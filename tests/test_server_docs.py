"""The shell sessions of README.md ("Run it as a service") and docs/http.md ("A curl
session") run as written against a real ``flowmem serve`` (on a free port)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from server_support import free_port

ROOT = Path(__file__).resolve().parent.parent


def _block(path: Path, heading: str) -> str:
    text = path.read_text(encoding="utf-8")
    section = text[text.index(heading):]
    found = re.search(r"```sh\n(.*?)```", section, re.S)
    assert found, f"no sh block under {heading!r} in {path.name}"
    return found.group(1)


SESSIONS = {"README": (ROOT / "README.md", "## Run it as a service"),
            "http.md": (ROOT / "docs" / "http.md", "## A curl session")}


@pytest.mark.parametrize("name", sorted(SESSIONS))
def test_shell_session_runs_as_written(name: str, tmp_path: Path) -> None:
    path, heading = SESSIONS[name]
    script = _block(path, heading).replace("8080", str(free_port()))
    script = "trap 'kill $SERVER 2>/dev/null' EXIT\n" + script  # no server left on a failure
    env = {**os.environ, "TMPDIR": str(tmp_path),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("FLOWMEM_STORE", None)
    process = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", script], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        else:
            with contextlib.suppress(ProcessLookupError):  # a server left by a failure
                os.killpg(process.pid, signal.SIGTERM)
    text = output.decode("utf-8", "replace")
    assert process.returncode == 0, text
    for code in re.findall(r'^#.*"error_code":"([a-z_]+)"', script, re.M):
        assert f'"error_code":"{code}"' in text, (code, text)
    assert text.count('"success":true') >= 1, text
