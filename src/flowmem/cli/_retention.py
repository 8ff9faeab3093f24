"""``flowmem sweep``: delete expired conversations and values once, in batches.

A thin layer over the service's sweep (:func:`flowmem.service._sweeper.sweep_once`):
the expiry of conversations and values is decided where the data was written,
by the retention policy of the memory that wrote it. The service's session
records are the exception: a record expires with its transcript under the
``session`` policy ``flowmem serve`` runs with, so ``--retention`` (the same
text) deletes expired sessions' records too. Prints the counts by scope.
``flowmem serve --retention … --sweep-interval …`` runs the same sweep in the
background.
"""

from __future__ import annotations

import asyncio

import click

from ..async_memory import AsyncMemory
from ..retention import InvalidRetention, Swept, parse_retention
from ._common import flowmem_errors, store_option

__all__ = ["register", "retention_option", "sweep"]


def retention_option(text: str | None) -> str | None:
    """A ``--retention`` text checked (a bad one: a one-line usage error)."""
    if text is not None:
        try:
            parse_retention(text)
        except InvalidRetention as exc:
            raise click.BadParameter(str(exc), param_hint="--retention") from None
    return text


@click.command()
@store_option
@click.option("--batch", default=100, show_default=True, type=click.IntRange(1, 10_000),
              help="Expired conversations and values deleted per transaction.")
@click.option("--retention", default=None, metavar="POLICY",
              callback=lambda _ctx, _param, text: retention_option(text),
              help="The policy `flowmem serve --retention` runs with: expired sessions' "
                   "records (scope session_record) are deleted too.")
def sweep(store: str | None, batch: int, retention: str | None) -> None:
    """Delete expired conversations and values now (see docs/operations.md, Retention)."""
    with flowmem_errors():
        swept = asyncio.run(_sweep(store, batch, retention))
    counts = ", ".join(f"{scope}={count}" for scope, count in sorted(swept.by_scope.items()))
    click.echo(f"swept {swept.total} expired ({counts or 'none'})")


async def _sweep(store: str | None, batch: int, retention: str | None) -> Swept:
    from ..service._sessions import SessionRegistry
    from ..service._sweeper import sweep_once

    async with AsyncMemory.from_url(store, retention=retention) as memory:
        sessions = None if retention is None else SessionRegistry(
            memory.store, retention=memory.retention, clock=memory.clock)
        return await sweep_once(memory, batch, sessions)


def register(group: click.Group) -> None:
    """Add ``sweep`` to the ``flowmem`` group."""
    group.add_command(sweep)
