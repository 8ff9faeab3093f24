"""The one small interface every contender implements.

A contender is one store holding any number of conversations, named by a
string. It is measured in its own process, one conversation length at a
time (see :mod:`bench.run_one`), which calls:

``convert(messages)``
    the workload (OpenAI dicts) to the contender's own message types, once,
    outside any timed region;
``open(workdir, bulk=...)``
    open (or reopen) the store in ``workdir``; ``bulk=True`` while
    prefilling, where a contender may pick a cheaper configuration that
    stores the same thing (flowmem's SQLite store prefills without fsync);
``prefill(conversation, items)``
    bring a conversation to the measured length, untimed, by the
    contender's cheapest correct path (a bulk insert, one checkpoint);
``append(conversation, item)``
    the timed operation: one message, one write;
``read_all(conversation)`` / ``read_last(conversation, n)``
    the timed reads;
``to_openai(history)``
    a read-back history as OpenAI dicts, for the sendability count;
``close()``.

A contender may override :meth:`Contender.timed_appends` (the Agents SDK
does, to stay inside one event loop).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

__all__ = ["Contender", "dir_bytes", "missing_modules"]


def dir_bytes(path: Path) -> int:
    """Bytes of every file under ``path`` (a database with its WAL and SHM files)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(root, name))
    return total


def missing_modules(*modules: str) -> str | None:
    """``None`` when every module can be imported, else why not."""
    for module in modules:
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            found = None
        if found is None:
            return f"not installed ({module}; pip install -e '.[bench]')"
    return None


class Contender:
    """Base class; subclasses set the class attributes and the methods they need."""

    name: ClassVar[str] = ""
    """Short identifier (used on the command line)."""
    label: ClassVar[str] = ""
    """Human-readable name for the tables."""
    durability: ClassVar[str] = ""
    """Journal and sync setting an append runs with (the contender's default)."""
    kind: ClassVar[str] = "peer"
    """``flowmem``, ``peer`` or ``floor``."""
    persistent: ClassVar[bool] = True
    """Whether the store lives in files under ``workdir`` (and survives :meth:`close`)."""
    reference: ClassVar[str] = "flowmem-sqlite-full"
    """The flowmem contender a peer or floor is compared with (matched durability)."""
    floor: ClassVar[str | None] = None
    """The floor a flowmem contender is compared with (same durability)."""
    max_length: ClassVar[int | None] = None
    """Longest length it is measured at (``None``: every length)."""
    max_length_reason: ClassVar[str] = ""
    notes: ClassVar[str] = ""

    workdir: Path

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this contender cannot run here, or ``None`` when it can."""
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
        raise NotImplementedError

    def to_openai(self, history: Any) -> list[dict[str, Any]]:
        return list(history)

    def close(self) -> None:
        """Release everything (a WAL database is checkpointed by its last close)."""
