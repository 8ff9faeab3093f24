"""The ``flowmem`` command: ``flowmem serve``, ``flowmem token create``, and the
memory commands of :mod:`flowmem.cli_memory` (read, write, delete, append,
history, normalize).

``flowmem serve`` runs the storage API (:func:`flowmem.server.create_app`)
under uvicorn; ``flowmem token create`` stores a new bearer token HASHED and
prints it once. Both open the store a URL names (``--store``; default
``$FLOWMEM_STORE`` or ``sqlite:///flowmem.db`` in the working directory).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import click

from . import cli_transcript, cli_transfer
from .cli_memory import register
from .errors import FlowmemError, MissingDependency
from .memory import Memory

__all__ = ["main"]

_STORE_HELP = "Store URL (default: $FLOWMEM_STORE or sqlite:///flowmem.db)."


def _memory(store: str | None) -> Memory:
    try:
        return Memory.from_url(store)
    except FlowmemError as exc:
        raise click.ClickException(str(exc)) from None


@click.group()
@click.version_option(package_name="flowmem")
def main() -> None:
    """flowmem: conversation memory for LLM agent workflows (GR-MEM)."""


@main.command()
@click.option("--store", default=None, help=_STORE_HELP)
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535),
              help="Port to bind.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]),
              help="How much uvicorn logs.")
def serve(store: str | None, host: str, port: int, log_level: str) -> None:
    """Serve the storage API over HTTP (see docs/http.md)."""
    try:
        import uvicorn

        from .server import create_app
    except ImportError as exc:
        missing = MissingDependency(getattr(exc, "name", None) or "fastapi", "server")
        raise click.ClickException(str(missing)) from None
    memory = _memory(store)
    app = create_app(memory)

    @asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        yield
        memory.close()  # graceful shutdown (SIGTERM, SIGINT): uvicorn then re-raises the signal

    app.router.lifespan_context = lifespan
    try:
        uvicorn.run(app, host=host, port=port, log_level=log_level)
    finally:
        memory.close()


@main.group()
def token() -> None:
    """Manage bearer tokens."""


@token.command("create")
@click.option("--user", "user_id", required=True, help="The user id the token stands for.")
@click.option("--admin", is_flag=True, help="Grant the administrative tier (MEM-15).")
@click.option("--store", default=None, help=_STORE_HELP)
def token_create(user_id: str, admin: bool, store: str | None) -> None:
    """Create a token and print it once (only its hash is stored)."""
    from .server.auth import TokenBackend

    memory = _memory(store)
    try:
        value = TokenBackend(memory.store).create(user_id, admin=admin)
    except FlowmemError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        memory.close()
    click.echo(value)


register(main)
cli_transfer.register(main)
cli_transcript.register(main)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
