"""``flowmem serve --workers N``: N server processes answering on one port, one store.

One server process spends its CPU on one core (the GIL); several share the
listening socket (uvicorn's supervisor binds it, then starts each worker
with it and restarts a worker that dies). Each worker opens the store
itself, so the store must be one that processes share — SQLite,
PostgreSQL, Redis; ``memory://`` is refused, as each worker would hold a
different memory.

What stays correct across workers because it lives in the store: every
MEM rule (the stores serialize appends across processes), tokens and
sessions (a revoke or a stop is announced through the store and seen by
every worker, :mod:`.changes`), idempotency keys, event streams (they read
the store). What is per worker: the rate-limit buckets (each worker
enforces ``--rate-limit`` on the requests it answers) and the counters of
``GET /metrics`` (it reports the worker that answered it).

The workers are spawned (a fresh interpreter each): they are given the
store URL and the settings in the environment variable :data:`SPEC`, as
JSON, and build the app with :func:`app_from_environment`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Final
from urllib.parse import urlsplit

import uvicorn
from fastapi import FastAPI

from ..access import Level
from ..async_memory import AsyncMemory
from ..errors import InvalidInput
from ..metrics import Metrics
from ._app import create_app
from ._limits import Limits
from ._protocols import protocol_path
from ._serving import KEEP_ALIVE, freeze_startup
from ._settings import Settings

__all__ = ["SPEC", "app_from_environment", "serve_workers", "settings_from_spec",
           "worker_spec"]

SPEC: Final = "FLOWMEM_WORKER_SPEC"
"""The environment variable that carries the store and settings to each worker."""


def worker_spec(store: str, settings: Settings, retention: str | None = None) -> str:
    """The JSON a worker rebuilds ``store`` and ``settings`` from.

    Refuses what one process cannot hand to another: a ``memory://`` store
    and access hooks (Python callables).
    """
    if urlsplit(store).scheme == "memory":
        raise InvalidInput("--workers needs a store that processes share (SQLite, PostgreSQL, "
                           "Redis): each worker would hold its own memory://")
    if settings.hooks:
        raise InvalidInput("access hooks cannot be handed to worker processes: "
                           "serve one process, or build the app with create_app")
    fields = {f.name: getattr(settings, f.name) for f in dataclasses.fields(Settings)
              if f.name not in ("hooks", "limits")}
    fields["anonymous"] = None if settings.anonymous is None else settings.anonymous.value
    fields["allowed_hosts"] = (None if settings.allowed_hosts is None
                               else list(settings.allowed_hosts))
    return json.dumps({"store": store, "limits": dataclasses.asdict(settings.limits),
                       "settings": fields, "retention": retention})


def settings_from_spec(spec: dict[str, Any]) -> Settings:
    """The :class:`Settings` a :func:`worker_spec` describes."""
    fields = dict(spec["settings"])
    if fields.get("anonymous") is not None:
        fields["anonymous"] = Level(fields["anonymous"])
    if fields.get("allowed_hosts") is not None:
        fields["allowed_hosts"] = tuple(fields["allowed_hosts"])
    return Settings(limits=Limits(**spec["limits"]), **fields)


def app_from_environment() -> FastAPI:
    """A worker's app: the store and settings of :data:`SPEC`, opened in this process."""
    spec = json.loads(os.environ[SPEC])
    memory = AsyncMemory.from_url(spec["store"], metrics=Metrics(),
                                  retention=spec.get("retention"))
    app = create_app(memory, settings_from_spec(spec), owns_memory=True)
    freeze_startup()
    return app


def serve_workers(spec: str, *, host: str, port: int, log_level: str, workers: int) -> None:
    """Serve from ``workers`` processes until SIGTERM/SIGINT, each building its app from
    ``spec`` (:func:`worker_spec`; see the module notes)."""
    if workers < 1:
        raise InvalidInput("workers must be at least 1")
    os.environ[SPEC] = spec
    uvicorn.run(f"{__name__}:app_from_environment", factory=True, workers=workers,
                host=host, port=port, log_level=log_level, http=protocol_path(),
                timeout_keep_alive=KEEP_ALIVE, server_header=False)
