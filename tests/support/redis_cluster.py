"""A private Redis Cluster for the tests and the bench: 3 masters (+ 3 replicas).

:func:`start_cluster` starts ``redis-server --cluster-enabled yes`` processes on
free ports in a temporary folder (no persistence), joins them with
``redis-cli --cluster create`` and waits for ``cluster_state:ok`` on every node
and, with replicas, for every replica to have replayed its master's whole
replication stream (conditions, never a fixed sleep). A test may pause a node
(``SIGSTOP``/``SIGCONT``), kill it and start it again (it rejoins as a replica
once the cluster has failed it over). :meth:`PrivateCluster.stop` kills them.
Never touches the shared Redis. :func:`cluster_unavailable` says why a
cluster cannot run here (no ``redis-server``/``redis-cli``), for a skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "PrivateCluster",
    "cli",
    "cluster_unavailable",
    "free_ports",
    "replication",
    "server_command",
    "start_cluster",
    "stop_servers",
    "synced",
]

NODE_TIMEOUT_MS = 1000
"""``cluster-node-timeout``: a dead master is failed over after about this long."""


def cluster_unavailable() -> str | None:
    """Why no private cluster can start here, or ``None``."""
    for tool in ("redis-server", "redis-cli"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (needed for a private Redis Cluster)"
    return None


def free_ports(count: int) -> list[int]:
    """``count`` free TCP ports whose cluster bus ports (+10000) are free too."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port + 10000 > 65535 or port in ports:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        ports.append(port)
    return ports


def cli(port: int, *args: str, timeout: float = 10.0) -> str:
    """``redis-cli -p port args…``'s output (empty when the node does not answer in time)."""
    try:
        done = subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True,
                              text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return ""
    return done.stdout


def server_command(port: int, folder: Path, *extra: str) -> list[str]:
    """``redis-server`` on ``port`` with no persistence, its files in ``folder``; a
    replica's first sync starts at once (no diskless-sync delay)."""
    return ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(folder), "--loglevel", "warning",
            "--repl-diskless-sync-delay", "0", *extra]


def replication(port: int) -> dict[str, str]:
    """``INFO replication`` of a node, field by field (empty when it does not answer)."""
    return dict(line.split(":", 1) for line in cli(port, "info", "replication").splitlines()
                if ":" in line)


def synced(replica: int) -> bool:
    """Whether a replica is in sync as its master sees it: online (after a diskless sync
    only from the replica's first acknowledgement on: until then ``WAIT`` does not count
    it) and acknowledged all the master has sent."""
    mine = replication(replica)
    if mine.get("role") != "slave" or mine.get("master_link_status") != "up":
        return False
    master = replication(int(mine["master_port"]))
    seen = [dict(pair.split("=", 1) for pair in value.split(","))
            for name, value in master.items() if name.startswith("slave") and "=" in value]
    return any(r.get("port") == str(replica) and r.get("state") == "online"
               and r.get("offset") == master.get("master_repl_offset") for r in seen)


@dataclass
class PrivateCluster:
    """The processes of one private cluster, by port."""

    folder: Path
    ports: list[int]
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    commands: dict[int, list[str]] = field(default_factory=dict)
    paused: set[int] = field(default_factory=set)

    def live(self) -> list[int]:
        """The ports of the nodes running and not paused."""
        return [p for p in self.ports
                if self.processes[p].poll() is None and p not in self.paused]

    @property
    def url(self) -> str:
        """A plain one-node URL (the first node): cluster mode is detected on connect."""
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def masters(self) -> list[int]:
        """The ports of the live masters (as a live node sees them)."""
        for port in self.live():
            text = cli(port, "cluster", "nodes")
            if text:
                return sorted(int(line.split()[1].split(":")[1].split("@")[0])
                              for line in text.splitlines()
                              if "master" in line.split()[2] and "fail" not in line.split()[2])
        return []

    def replica_of(self, master: int) -> int:
        """The port of a replica of the master on ``master``."""
        for port in self.live():
            if port != master:
                info = replication(port)
                if info.get("role") == "slave" and info.get("master_port") == str(master):
                    return port
        raise LookupError(f"no live replica of :{master}")

    def kill(self, port: int) -> None:
        """``kill -9`` one node's process."""
        self.processes[port].kill()
        self.processes[port].wait()

    def pause(self, port: int) -> None:
        """``SIGSTOP`` one node: it answers nothing, acknowledges no replication."""
        os.kill(self.processes[port].pid, signal.SIGSTOP)
        self.paused.add(port)

    def resume(self, port: int) -> None:
        os.kill(self.processes[port].pid, signal.SIGCONT)
        self.paused.discard(port)

    def restart(self, port: int) -> None:
        """Start a killed node again, from its ``nodes.conf`` and no data: once the cluster
        has failed it over, it rejoins as a replica of the master that took its slots."""
        self.processes[port] = subprocess.Popen(self.commands[port], stdout=subprocess.DEVNULL,
                                                stderr=subprocess.DEVNULL)

    def wait_synced(self, timeout: float = 30.0) -> None:
        """Until every live replica has replayed its master's whole replication stream."""
        deadline = time.monotonic() + timeout
        while True:
            masters = self.masters()
            replicas = [p for p in self.live() if p not in masters]
            if all(synced(p) for p in replicas):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the private cluster's replicas are not in sync after "
                                   f"{timeout} s")
            time.sleep(0.05)

    def wait_ok(self, timeout: float = 60.0, masters: int = 3,
                replaced: int | None = None) -> None:
        """Until every live node says ``cluster_state:ok`` and a live node counts ``masters``
        masters; with ``replaced`` (a killed master's port), none of them that one: a
        replica took over its slots (right after a kill the others still count it)."""
        deadline = time.monotonic() + timeout
        while True:
            live = self.live()
            states = [cli(p, "cluster", "info") for p in live]
            now = self.masters()
            if (all("cluster_state:ok" in s for s in states) and len(now) == masters
                    and replaced not in now):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the private cluster is not ok after {timeout} s: "
                                   f"{[s.splitlines()[:1] for s in states]}")
            time.sleep(0.05)

    def stop(self) -> None:
        stop_servers(self.processes.values(), self.folder)


def start_cluster(replicas: int = 0, attempts: int = 3) -> PrivateCluster:
    """3 masters, each with ``replicas`` replicas, on free ports; ``cluster_state:ok``.

    Up to ``attempts`` tries, each on fresh ports: on a loaded machine
    ``redis-cli --cluster create`` has been seen waiting for the nodes to join
    past its bound (a server-side start-up failure, not what the tests check)."""
    reason = cluster_unavailable()
    if reason:
        raise RuntimeError(reason)
    failures: list[str] = []
    for _ in range(attempts):
        try:
            return _start_cluster(replicas)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            failures.append(f"{type(exc).__name__}: {str(exc)[:200]}")
    raise RuntimeError(f"the private cluster did not start in {attempts} tries: {failures}")


def _start_cluster(replicas: int) -> PrivateCluster:
    folder = Path(tempfile.mkdtemp(prefix="flowmem-cluster-"))
    cluster = PrivateCluster(folder, free_ports(3 * (1 + replicas)))
    try:
        for port in cluster.ports:
            node_dir = folder / str(port)
            node_dir.mkdir()
            cluster.commands[port] = server_command(
                port, node_dir, "--cluster-enabled", "yes", "--cluster-config-file",
                "nodes.conf", "--cluster-node-timeout", str(NODE_TIMEOUT_MS))
            cluster.processes[port] = subprocess.Popen(
                cluster.commands[port], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while not all(cli(p, "ping") == "PONG\n" for p in cluster.ports):
            if time.monotonic() > deadline:
                raise RuntimeError("the private cluster's nodes did not start")
            time.sleep(0.02)
        created = subprocess.run(
            ["redis-cli", "--cluster", "create",
             *(f"127.0.0.1:{p}" for p in cluster.ports),
             "--cluster-replicas", str(replicas), "--cluster-yes"],
            capture_output=True, text=True, timeout=30, check=False)
        if created.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {created.stdout[-500:]}")
        cluster.wait_ok()
        if replicas:  # every replica has synced: a failover loses nothing acknowledged yet
            cluster.wait_synced()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def stop_servers(processes: Iterable[subprocess.Popen[bytes]], folder: Path) -> None:
    """Kill private servers and remove their folder."""
    for process in processes:
        with contextlib.suppress(OSError):
            process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
    shutil.rmtree(folder, ignore_errors=True)
