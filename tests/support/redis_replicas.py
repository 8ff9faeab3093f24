"""A private standalone Redis primary with one replica, for the ``wait_replicas`` tests.

:func:`start_replicated` starts two ``redis-server`` processes on free ports in
a temporary folder (no persistence), the second ``--replicaof`` the first, and
waits until the replica has replayed the primary's whole replication stream
(a condition, never a fixed sleep). A test may pause the replica
(``SIGSTOP``: it acknowledges nothing) and resume it. Never touches the shared
Redis; :func:`redis_cluster.cluster_unavailable` says why it cannot run here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from redis_cluster import (
    cli,
    cluster_unavailable,
    free_ports,
    server_command,
    stop_servers,
    synced,
)

__all__ = ["PrivateReplicated", "start_replicated"]


@dataclass
class PrivateReplicated:
    """A primary and its replica, by port."""

    folder: Path
    primary: int
    replica: int
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """The primary's URL, database 0."""
        return f"redis://127.0.0.1:{self.primary}/0"

    def pause(self) -> None:
        """``SIGSTOP`` the replica: the primary keeps it connected, it confirms nothing."""
        os.kill(self.processes[self.replica].pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.processes[self.replica].pid, signal.SIGCONT)

    def wait_synced(self, timeout: float = 30.0) -> None:
        """Until the replica has replayed all the primary has sent it."""
        deadline = time.monotonic() + timeout
        while not synced(self.replica):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the private replica is not in sync after {timeout} s")
            time.sleep(0.02)

    def stop(self) -> None:
        stop_servers(self.processes.values(), self.folder)


def start_replicated() -> PrivateReplicated:
    """A primary and one replica on free ports, the replica in sync."""
    reason = cluster_unavailable()
    if reason:
        raise RuntimeError(reason)
    folder = Path(tempfile.mkdtemp(prefix="flowmem-replicated-"))
    primary, replica = free_ports(2)
    pair = PrivateReplicated(folder, primary, replica)
    try:
        for port, extra in ((primary, ()), (replica, ("--replicaof", "127.0.0.1", str(primary)))):
            (folder / str(port)).mkdir()
            pair.processes[port] = subprocess.Popen(
                server_command(port, folder / str(port), *extra),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while not all(cli(p, "ping") == "PONG\n" for p in (primary, replica)):
            if time.monotonic() > deadline:
                raise RuntimeError("the private primary and replica did not start")
            time.sleep(0.02)
        pair.wait_synced()
    except BaseException:
        pair.stop()
        raise
    return pair
