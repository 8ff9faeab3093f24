"""flowmem itself: ``memory://``, ``sqlite://`` (FULL and NORMAL), PostgreSQL, Redis, HTTP.

Every flowmem contender goes through the public coordinator,
``Memory.append("session", conversation, message, context=...)``, one message
per call — the full MEM-1..14 path a runtime takes. ``read_all`` is
``Memory.read`` (the whole conversation), ``read_last`` is
``Memory.history(last=n)``.

The server backends (PostgreSQL, Redis, HTTP) were being written while this
benchmark was; each is detected at run time and reported as "not available
yet" when its module is missing (or "not available" when its server does
not answer).
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from flowmem import ExecutionContext
from flowmem.memory import Memory

from ..sendability import canonical_to_openai
from .base import Contender, missing_modules

__all__ = [
    "FlowmemHTTP",
    "FlowmemMemory",
    "FlowmemPostgres",
    "FlowmemRedis",
    "FlowmemSQLiteFull",
    "FlowmemSQLiteNormal",
]

SCOPE = "session"
POSTGRES_URL = "postgresql://127.0.0.1/test"
REDIS_URL = "redis://127.0.0.1:6379/0"


class _Flowmem(Contender):
    kind = "flowmem"

    def __init__(self) -> None:
        self.context = ExecutionContext(session_id=f"bench-{uuid.uuid4().hex}")
        self.memory: Memory | None = None

    def url(self, *, bulk: bool = False) -> str:
        raise NotImplementedError

    def open(self, workdir: Path, *, bulk: bool = False) -> None:
        super().open(workdir)
        self.memory = Memory.from_url(self.url(bulk=bulk))

    def append(self, conversation: str, item: Any) -> None:
        assert self.memory is not None
        self.memory.append(SCOPE, conversation, item, context=self.context)

    def read_all(self, conversation: str) -> Any:
        assert self.memory is not None
        return self.memory.read(SCOPE, conversation, context=self.context).value or []

    def read_last(self, conversation: str, n: int) -> Any:
        assert self.memory is not None
        return self.memory.history(SCOPE, conversation, context=self.context, last=n).messages

    def to_openai(self, history: Any) -> list[dict[str, Any]]:
        return canonical_to_openai(history)

    def close(self) -> None:
        if self.memory is not None:
            self.memory.close()
            self.memory = None


class FlowmemMemory(_Flowmem):
    name = "flowmem-memory"
    label = "flowmem memory://"
    durability = "none (in process)"
    persistent = False
    floor = "python-list"

    def url(self, *, bulk: bool = False) -> str:
        return "memory://"


class _FlowmemSQLite(_Flowmem):
    synchronous: ClassVar[str] = "full"
    notes = ("Prefilled through the same per-message appends with `synchronous=off`, then "
             "reopened at the measured setting.")

    def url(self, *, bulk: bool = False) -> str:
        path = self.workdir / "flowmem.db"
        return f"sqlite:///{path}?synchronous={'off' if bulk else self.synchronous}"


class FlowmemSQLiteFull(_FlowmemSQLite):
    name = "flowmem-sqlite-full"
    label = "flowmem sqlite:// (default: FULL)"
    durability = "WAL, synchronous=FULL (flowmem's default)"
    floor = "raw-sqlite-wal-full"
    synchronous = "full"


class FlowmemSQLiteNormal(_FlowmemSQLite):
    name = "flowmem-sqlite-normal"
    label = "flowmem sqlite:// ?synchronous=normal"
    durability = "WAL, synchronous=NORMAL"
    floor = "raw-sqlite-wal-normal"
    synchronous = "normal"


class _FlowmemServer(_Flowmem):
    """A flowmem store on a server: prefilled in batches (one round trip per 200 messages)."""

    module: ClassVar[str] = ""
    server_url: ClassVar[str] = ""
    persistent = False  # nothing under workdir; the server keeps it
    notes = "Prefilled in batches of 200 messages per append call; the timed appends are single."

    @classmethod
    def unavailable(cls) -> str | None:
        if missing_modules(cls.module):
            return f"not available yet ({cls.module} does not exist)"
        try:
            memory = Memory.from_url(cls.server_url)
            memory.read(SCOPE, "bench-probe", context=ExecutionContext(session_id="probe"))
            memory.close()
        except Exception as exc:  # a server down, a dependency missing
            return f"not available ({type(exc).__name__}: {exc})"
        return None

    def url(self, *, bulk: bool = False) -> str:
        return self.server_url

    def prefill(self, conversation: str, items: Sequence[Any]) -> None:
        assert self.memory is not None
        for start in range(0, len(items), 200):
            self.memory.append(SCOPE, conversation, list(items[start:start + 200]),
                               context=self.context)

    def close(self) -> None:
        if self.memory is not None:
            for key in self.memory.store.keys(SCOPE, self.context.session_id, limit=1000):
                self.memory.delete(SCOPE, key, context=self.context)
        super().close()


class FlowmemPostgres(_FlowmemServer):
    name = "flowmem-postgres"
    label = "flowmem postgresql://"
    durability = "PostgreSQL commit (synchronous_commit=on, fsync=on)"
    module = "flowmem.stores.postgres"
    server_url = POSTGRES_URL


class FlowmemRedis(_FlowmemServer):
    name = "flowmem-redis"
    label = "flowmem redis://"
    durability = "Redis server as configured (here: no AOF, no RDB snapshots)"
    module = "flowmem.stores.redis"
    server_url = REDIS_URL


class FlowmemHTTP(_Flowmem):
    """``flowmem serve`` on a SQLite file, driven over HTTP with one keep-alive client."""

    name = "flowmem-http"
    label = "flowmem over HTTP (flowmem serve, sqlite://)"
    durability = "its store: WAL, synchronous=FULL (flowmem's default)"
    notes = ("A real `flowmem serve` process on 127.0.0.1; `POST /v1/memory/append` under the "
             "`global` scope, one message per request (each response also echoes the newest "
             "50 messages, as the API does); the full read is `POST /v1/memory/read`, the last "
             "50 `POST /v1/memory/history` with `limit: 50` (an admin token; "
             "`--rate-limit 0`). Prefilled in requests of 100 messages against a "
             "`synchronous=off` server, then restarted at FULL. RSS and CPU of the server "
             "process are not in this process's figures.")

    @classmethod
    def unavailable(cls) -> str | None:
        if missing_modules("flowmem.server"):
            return "not available yet (flowmem.server does not exist)"
        return missing_modules("fastapi", "uvicorn", "httpx")

    def open(self, workdir: Path, *, bulk: bool = False) -> None:
        import httpx

        self.workdir = workdir
        store = f"sqlite:///{workdir / 'flowmem.db'}?synchronous={'off' if bulk else 'full'}"
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        command = [shutil.which("flowmem") or "", "serve"] if shutil.which("flowmem") else [
            sys.executable, "-m", "flowmem.cli", "serve"]
        admin = subprocess.run([*command[:-1], "token", "create", "--user", "bench", "--admin",
                                "--store", store], capture_output=True, text=True, check=True)
        self.process = subprocess.Popen(
            [*command, "--store", store, "--port", str(port), "--log-level", "warning",
             "--rate-limit", "0", "--max-read-bytes", str(2**40)], cwd=workdir)
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60.0,
                                   headers={"Authorization": f"Bearer {admin.stdout.strip()}"})
        deadline = time.monotonic() + 30
        while True:
            try:
                if self.client.get("/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.close()
                raise RuntimeError("flowmem serve did not come up")
            time.sleep(0.05)

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        response = self.client.post(path, json=body)
        response.raise_for_status()
        return response.json()["data"]

    def prefill(self, conversation: str, items: Sequence[Any]) -> None:
        for start in range(0, len(items), 100):
            self._post("/v1/memory/append", {"scope": "global", "key": conversation,
                                             "messages": list(items[start:start + 100])})

    def append(self, conversation: str, item: Any) -> None:
        self._post("/v1/memory/append",
                   {"scope": "global", "key": conversation, "messages": [item]})

    def read_all(self, conversation: str) -> Any:
        return self._post("/v1/memory/read",
                          {"scope": "global", "key": conversation})["value"] or []

    def read_last(self, conversation: str, n: int) -> Any:
        page = self._post("/v1/memory/history", {"scope": "global", "key": conversation,
                                                 "limit": n})
        return [item["message"] for item in page["messages"]]

    def close(self) -> None:
        client, process = getattr(self, "client", None), getattr(self, "process", None)
        if client is not None:
            client.close()
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
