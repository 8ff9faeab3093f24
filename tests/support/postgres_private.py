"""A private PostgreSQL server for the fault tests: started in a temporary directory on a
free port, then stopped (SIGSTOP), resumed, restarted and finally removed by the tests.

The shared server (``FLOWMEM_TEST_POSTGRES``) is never touched. PostgreSQL refuses to
run as root, so as root the server runs as the ``postgres`` user (``runuser``); where
that is impossible :func:`start` returns the reason and the tests skip with it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["PrivatePostgres", "start"]


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parent.parent.name)
                   if Path(p).parent.parent.name.isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry))
    return found


@dataclass
class PrivatePostgres:
    """One private server: its data directory, port and the user it runs as."""

    bindir: Path
    datadir: Path
    port: int
    run_as: list[str] = field(default_factory=list)
    options: str = ""
    frozen: list[int] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _pg_ctl(self, *args: str) -> None:
        subprocess.run([*self.run_as, str(self.bindir / "pg_ctl"), "-D", str(self.datadir),
                        "-l", str(self.datadir / "server.log"), "-w", "-t", "60", *args],
                       check=True, capture_output=True, timeout=90)

    def postmaster(self) -> int:
        return int((self.datadir / "postmaster.pid").read_text().split()[0])

    def freeze(self) -> None:
        """SIGSTOP the postmaster, then every process it started: the kernel still
        accepts and acknowledges TCP, the server answers nothing."""
        main = self.postmaster()
        os.kill(main, signal.SIGSTOP)
        self.frozen = [main]
        for child in _children(main):
            os.kill(child, signal.SIGSTOP)
            self.frozen.append(child)

    def thaw(self) -> None:
        for pid in reversed(self.frozen):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.frozen = []

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: clients are disconnected, the server comes back."""
        self._pg_ctl("restart", "-m", "fast")

    def outage(self, seconds: float) -> None:
        """``pg_ctl stop -m fast``, ``seconds`` with no server (connections refused), start."""
        self._pg_ctl("stop", "-m", "fast")
        time.sleep(seconds)
        self._pg_ctl("start", "-o", self.options)

    def remove(self) -> None:
        self.thaw()
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._pg_ctl("stop", "-m", "immediate")
        shutil.rmtree(self.datadir.parent, ignore_errors=True)


def start() -> PrivatePostgres | str:
    """A running private server, or the reason there cannot be one here."""
    bindir = _bindir()
    if bindir is None:
        return "no PostgreSQL server binaries (initdb) on this machine"
    run_as: list[str] = []
    datadir = Path(tempfile.mkdtemp(prefix="flowmem-pg-faults-"))
    if os.geteuid() == 0:
        runuser = shutil.which("runuser")
        try:
            import pwd

            user = pwd.getpwnam("postgres")
        except KeyError:
            user = None
        if runuser is None or user is None:
            shutil.rmtree(datadir, ignore_errors=True)
            return "running as root without a postgres user and runuser to run the server as"
        os.chown(datadir, user.pw_uid, user.pw_gid)
        run_as = [runuser, "-u", "postgres", "--"]
    server = PrivatePostgres(bindir, datadir / "data", _free_port(), run_as)
    try:
        subprocess.run([*run_as, str(bindir / "initdb"), "-D", str(server.datadir), "-A",
                        "trust", "-U", "postgres", "-E", "UTF8", "--no-locale", "--no-sync"],
                       check=True, capture_output=True, timeout=120)
        server.options = (f"-c listen_addresses=127.0.0.1 -c port={server.port} "
                          f"-c unix_socket_directories={server.datadir} "
                          f"-c max_connections=60 -c shared_buffers=16MB")
        server._pg_ctl("start", "-o", server.options)
    except (subprocess.SubprocessError, OSError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        shutil.rmtree(datadir, ignore_errors=True)
        return f"cannot start a private PostgreSQL server: {exc} {detail.decode()[-300:]}"
    return server
