"""The one small interface every contender implements.

A contender is one store holding any number of conversations, named by a
string, measured in its own process one length at a time (:mod:`bench.run_one`):
``convert`` the workload (OpenAI dicts) to its own types once, untimed;
``open(workdir, bulk=True)`` and ``prefill`` each conversation to the length by
the cheapest correct path (``bulk``: a configuration that stores the same thing
more cheaply, e.g. flowmem's SQLite store without fsync); reopen; time
``append`` (one message, one write) through :meth:`Contender.timed_appends`,
then ``read_all`` and ``read_last``; ``to_openai`` for the sendability count;
``close``.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar


def dir_bytes(path: Path) -> int:
    """Bytes of every file under ``path`` (a database with its WAL and SHM files)."""
    return sum(file.stat().st_size for file in path.rglob("*") if file.is_file())


class Contender:
    """Base class; subclasses set the class attributes and the methods they need."""

    name: ClassVar[str] = ""  # the identifier on the command line
    label: ClassVar[str] = ""  # the name in the tables
    durability: ClassVar[str] = ""  # journal and sync setting an append runs with
    kind: ClassVar[str] = "peer"  # flowmem, peer or floor
    persistent: ClassVar[bool] = True  # lives in files under workdir, survives close()
    reference: ClassVar[str] = "flowmem-sqlite-full"  # what a peer or floor is compared with
    floor: ClassVar[str | None] = None  # what a flowmem contender is compared with
    max_length: ClassVar[int | None] = None  # longest length measured (None: every length)
    max_length_reason: ClassVar[str] = ""
    notes: ClassVar[str] = ""
    needs: ClassVar[tuple[str, ...]] = ()  # modules it imports (the bench extra)

    workdir: Path

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this contender cannot run here, or ``None`` when it can."""
        for module in cls.needs:
            try:
                found = importlib.util.find_spec(module)
            except (ImportError, ValueError):
                found = None
            if found is None:
                return f"not installed ({module}; pip install -e '.[bench]')"
        return None

    def convert(self, messages: Sequence[dict[str, Any]]) -> list[Any]:
        return list(messages)

    def open(self, workdir: Path, *, bulk: bool = False) -> None:
        self.workdir = workdir

    def prefill(self, conversation: str, items: Sequence[Any]) -> None:
        for item in items:
            self.append(conversation, item)

    def append(self, conversation: str, item: Any) -> None:
        raise NotImplementedError

    def timed_appends(self, conversation: str, items: Sequence[Any]) -> int:
        """Append ``items`` one by one; the elapsed nanoseconds."""
        append = self.append
        start = time.perf_counter_ns()
        for item in items:
            append(conversation, item)
        return time.perf_counter_ns() - start

    def read_all(self, conversation: str) -> Any:
        raise NotImplementedError

    def read_last(self, conversation: str, n: int) -> Any:
        return self.read_all(conversation)[-n:]

    def to_openai(self, history: Any) -> list[dict[str, Any]]:
        return list(history)

    def close(self) -> None:
        """Release everything (a WAL database is checkpointed by its last close)."""
