"""The suite's own infrastructure: a PostgreSQL that answers but refuses the login skips."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from backends import POSTGRES_URL, _reachable, shown, unavailable, with_option

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]


def test_a_password_never_reaches_a_skip_reason() -> None:
    assert shown("postgresql://u:s3cret@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert shown("redis://127.0.0.1:6379/15") == "redis://127.0.0.1:6379/15"


@pytest.mark.skipif(not _reachable(POSTGRES_URL, 5432), reason="PostgreSQL is not reachable")
def test_postgres_tests_skip_with_the_reason_when_the_login_is_refused() -> None:
    assert unavailable("postgres") is None or "refused" in str(unavailable("postgres"))
    parts = urlsplit(POSTGRES_URL)
    host = f"{parts.hostname or '127.0.0.1'}:{parts.port or 5432}"
    refused = parts._replace(netloc=f"flowmem_no_such_role@{host}", query="").geturl()
    env = {**os.environ, "FLOWMEM_TEST_POSTGRES": with_option(refused, "connect_timeout", "3")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-n", "0",
         "tests/stores/postgres/test_postgres_store.py"],  # -n 0: no workers for 14 skips
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "passed" not in done.stdout.splitlines()[-1]
    assert "skipped" in done.stdout and "refused the connection" in done.stdout
    assert 'role "flowmem_no_such_role" does not exist' in done.stdout
