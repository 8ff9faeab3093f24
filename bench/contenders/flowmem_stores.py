"""flowmem itself: ``memory://``, ``sqlite://`` (FULL and NORMAL), PostgreSQL, Redis.

Through the public coordinator, one message per ``Memory.append`` call: the full
path a runtime takes. A store whose server does not answer is not available.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from flowmem import ExecutionContext
from flowmem.memory import Memory

from ..sendability import canonical_to_openai
from .base import Contender

SCOPE = "session"
# a schema and prefix of the benchmark's own (a server's default ones may hold other data)
POSTGRES_URL = os.environ.get("FLOWMEM_BENCH_POSTGRES",
                              "postgresql://127.0.0.1/test?schema=flowmem_bench")
REDIS_URL = os.environ.get("FLOWMEM_BENCH_REDIS", "redis://127.0.0.1:6379/0?prefix=flowmem_bench")


class _Flowmem(Contender):
    kind = "flowmem"

    memory: Memory

    def __init__(self) -> None:
        self.context = ExecutionContext(session_id=f"bench-{uuid.uuid4().hex}")

    def open(self, workdir: Path, *, bulk: bool = False) -> None:
        super().open(workdir)
        self.memory = Memory.from_url(self.url(bulk=bulk))

    def url(self, *, bulk: bool = False) -> str:
        return "memory://"

    def append(self, conversation: str, item: Any) -> None:
        self.memory.append(SCOPE, conversation, item, context=self.context)

    def read_all(self, conversation: str) -> Any:
        return self.memory.read(SCOPE, conversation, context=self.context).value or []

    def read_last(self, conversation: str, n: int) -> Any:
        return self.memory.history(SCOPE, conversation, context=self.context, last=n).messages

    def to_openai(self, history: Any) -> list[dict[str, Any]]:
        return canonical_to_openai(history)

    def close(self) -> None:
        self.memory.close()


class FlowmemMemory(_Flowmem):
    name = "flowmem-memory"
    label = "flowmem memory://"
    durability = "none (in process)"
    persistent = False
    floor = "python-list"


class _FlowmemSQLite(_Flowmem):
    synchronous: ClassVar[str] = "full"
    floor = "raw-sqlite-wal-full"
    notes = ("Prefilled through the same per-message appends with `synchronous=off`, then "
             "reopened at the measured setting.")

    def url(self, *, bulk: bool = False) -> str:
        path = self.workdir / "flowmem.db"
        return f"sqlite:///{path}?synchronous={'off' if bulk else self.synchronous}"


class FlowmemSQLiteFull(_FlowmemSQLite):
    name = "flowmem-sqlite-full"
    label = "flowmem sqlite:// (default: FULL)"
    durability = "WAL, synchronous=FULL (flowmem's default)"


class FlowmemSQLiteNormal(_FlowmemSQLite):
    name = "flowmem-sqlite-normal"
    label = "flowmem sqlite:// ?synchronous=normal"
    durability = "WAL, synchronous=NORMAL"
    floor = "raw-sqlite-wal-normal"
    synchronous = "normal"


class _FlowmemServer(_Flowmem):
    server_url: ClassVar[str] = ""
    persistent = False  # nothing under workdir; the server keeps it
    notes = "Prefilled in batches of 200 messages per append call; the timed appends are single."

    @classmethod
    def unavailable(cls) -> str | None:
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
        for start in range(0, len(items), 200):
            self.memory.append(SCOPE, conversation, list(items[start:start + 200]),
                               context=self.context)

    def close(self) -> None:
        for key in self.memory.store.keys(SCOPE, self.context.session_id, limit=1000):
            self.memory.delete(SCOPE, key, context=self.context)
        super().close()


class FlowmemPostgres(_FlowmemServer):
    name = "flowmem-postgres"
    label = "flowmem postgresql://"
    durability = "PostgreSQL commit (synchronous_commit=on, fsync=on)"
    server_url = POSTGRES_URL


class FlowmemRedis(_FlowmemServer):
    name = "flowmem-redis"
    label = "flowmem redis://"
    durability = "Redis server as configured (here: no AOF, no RDB snapshots)"
    server_url = REDIS_URL
