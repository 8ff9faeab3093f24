"""A private pgbouncer in TRANSACTION pooling mode in front of the test database."""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from backends import POSTGRES_URL, unavailable


def pgbouncer_missing() -> str | None:
    """Why a pgbouncer cannot run here, or ``None``."""
    return unavailable("postgres") or (None if shutil.which("pgbouncer") else
                                       "pgbouncer is not installed (apt-get install pgbouncer)")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pgbouncer(pool_size: int) -> Any:
    """Start pgbouncer (transaction mode, ``pool_size`` server connections) in front of
    the test database; yields ``(host:port, user)``; the database is named ``flowmem``.
    Raises RuntimeError (with the log's path) when it does not start."""
    parts = urlsplit(POSTGRES_URL)
    return pgbouncer_at(parts.hostname or "127.0.0.1", parts.port or 5432,
                        parts.username or getpass.getuser(),
                        parts.path.lstrip("/") or "postgres", pool_size)


@contextmanager
def pgbouncer_at(host: str, port: int, user: str, dbname: str,
                 pool_size: int) -> Iterator[tuple[str, str]]:
    """:func:`pgbouncer` in front of any server."""
    server_port = port
    folder = tempfile.mkdtemp(prefix="flowmem-pgbouncer-")
    os.chmod(folder, 0o777)  # pgbouncer may run as another user
    port = _free_port()
    ini = os.path.join(folder, "pgbouncer.ini")
    with open(ini, "w", encoding="utf-8") as config:
        config.write(f"""[databases]
flowmem = host={host} port={server_port} dbname={dbname} user={user}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
auth_type = any
pool_mode = transaction
default_pool_size = {pool_size}
max_client_conn = 200
admin_users = {user}, pgbouncer
logfile = {folder}/pgbouncer.log
pidfile = {folder}/pgbouncer.pid
unix_socket_dir =
""")
    os.chmod(ini, 0o644)
    command = ["pgbouncer", ini]
    if os.geteuid() == 0:
        command[1:1] = ["-u", "postgres"]  # pgbouncer refuses to run as root
    process = subprocess.Popen(command)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError as exc:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"pgbouncer did not start (see {folder}/pgbouncer.log)") from exc
                time.sleep(0.05)
        yield f"127.0.0.1:{port}", user
    finally:
        process.terminate()
        process.wait(15)
        shutil.rmtree(folder, ignore_errors=True)
