"""``flowmem erase --user ID``: a user's data deleted everywhere the service keeps it.

An operator's tool with direct access to the store, like ``flowmem token``: it
runs :func:`flowmem.service._erasure.erase_user` — her user scope, the sessions
she owns, her viewer links, her tokens, the writer records naming her and the
idempotency records of everything deleted — and prints the receipt (a table, or
``--json``). ``--dry-run`` counts and deletes nothing. Workflow, pipeline,
execution and global memories are not per-user and are left as they are.
"""

from __future__ import annotations

import asyncio
import json

import click

from ..async_memory import AsyncMemory
from ..erasure import ErasureReceipt
from ..errors import FlowmemError
from ..ids import usable_id
from ..render import printable
from ._common import store_option
from ._exit import cli_error

__all__ = ["register"]


@click.command()
@click.option("--user", "user_id", required=True, help="The user id to erase.")
@click.option("--dry-run", is_flag=True, help="Count what would go; delete nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the receipt as one JSON object.")
@store_option
def erase(user_id: str, dry_run: bool, as_json: bool, store: str | None) -> None:
    """Erase a user: her memory, sessions, viewer links, tokens and writer records."""
    if usable_id(user_id) is None:
        raise click.BadParameter(f"{user_id!r} is not a usable user id (blank, or \"0\", "
                                 "the anonymous user)", param_hint="--user")
    from ..service._erasure import erase_user

    async def run() -> ErasureReceipt:
        async with AsyncMemory.from_url(store) as memory:
            return await erase_user(memory, user_id, dry_run=dry_run)

    try:
        receipt = asyncio.run(run())
    except FlowmemError as exc:
        raise cli_error(exc) from None
    if as_json:
        click.echo(json.dumps(receipt.to_json(), ensure_ascii=True))
        return
    shown = receipt.to_json()
    click.echo(f"{'would erase' if dry_run else 'erased'} user {printable(receipt.user_id)} "
               f"at {shown['erased_at']}: {receipt.total} items")
    rows = [("KIND", "COUNT"), *((kind, str(count)) for kind, count in receipt.counts.items())]
    width = max(len(kind) for kind, _ in rows)
    for kind, count in rows:
        click.echo(f"{kind.ljust(width)}  {count}")


def register(group: click.Group) -> None:
    """Add ``erase`` to the ``flowmem`` group."""
    group.add_command(erase)
