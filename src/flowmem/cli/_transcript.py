"""``flowmem transcript``: a conversation as a readable, coloured transcript.

A thin layer: the page is read (``Memory.history`` for ``--scope``/``--key``;
for a SESSION of ``flowmem serve``, its record through the session registry
and its conversation through ``AsyncMemory.history`` with the session's
context, MEM-8), :func:`flowmem.render.render_transcript` (pure) draws it,
``rich`` prints it. Colours follow the terminal unless ``--color``/``--no-color``
says otherwise (``NO_COLOR`` is honoured).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.text import Text

from ..render import printable, render_transcript
from ..scopes import SCOPES
from ._common import (
    REFUSED_EXIT,
    context_of,
    context_options,
    flowmem_errors,
    open_memory,
    store_option,
    warn_shared_bucket,
)
from ._sessions import load_session, with_registry

if TYPE_CHECKING:
    from ..access import SessionRecord
    from ..async_memory import AsyncMemory
    from ..memory import HistoryResult
    from ..service._sessions import SessionRegistry

__all__ = ["register", "transcript"]

_WHICH = "give a SESSION (from `flowmem sessions list`), or --scope and --key"


def _session_page(store: str | None, session_id: str,
                  last: int | None) -> tuple[SessionRecord, HistoryResult]:
    """The session's record and the page of its conversation (MEM-8: its context)."""
    from ..service._sessions import TRANSCRIPT_KEY, session_context

    async def work(registry: SessionRegistry,
                   memory: AsyncMemory) -> tuple[SessionRecord, HistoryResult]:
        record = await load_session(registry, session_id)
        page = await memory.history("session", TRANSCRIPT_KEY, context=session_context(record),
                                    last=last)
        return record, page

    return with_registry(store, work)


def _scope_page(store: str | None, scope: str, key: str, last: int | None,
                ids: dict[str, Any]) -> HistoryResult:
    context = context_of(ids)
    memory = open_memory(store)
    with flowmem_errors(), memory:
        page = memory.history(scope, key, context=context, last=last)
    if page.refused:
        click.echo(f"flowmem: {scope} scope refused; nothing to show", err=True)
        sys.exit(REFUSED_EXIT)
    warn_shared_bucket(page.scope, page.resolved_scope_id, page.refused)
    return page


@click.command("transcript")
@click.argument("session", metavar="[SESSION]", required=False)
@store_option
@click.option("--scope", type=click.Choice(SCOPES), default=None,
              help="Where the conversation lives (with --key; instead of SESSION); user and "
                   "session need --user/--session (MEM-6, MEM-13).")
@click.option("--key", default=None, help="The conversation's key (with --scope).")
@context_options
@click.option("--last", type=click.IntRange(1), default=100, show_default=True,
              help="How many of the newest messages to show.")
@click.option("--all", "everything", is_flag=True,
              help="Show the whole conversation (overrides --last).")
@click.option("--color/--no-color", default=None,
              help="Force colours on or off (default: on for a terminal).")
@click.option("--width", type=click.IntRange(40, 1000), default=None,
              help="Line width (default: the terminal's).")
def transcript(session: str | None, store: str | None, scope: str | None, key: str | None,
               last: int, everything: bool, color: bool | None, width: int | None,
               **ids: Any) -> None:
    """Print a conversation — a SESSION of `flowmem serve`, or --scope/--key — with
    roles, tool-call cards and their results, healed and late entries marked
    (MEM-3, MEM-10)."""
    count = None if everything else last
    console = Console(width=width, force_terminal=color,
                      no_color=None if color is None else not color, highlight=False)
    if session is not None:
        if scope is not None or key is not None or any(v is not None for v in ids.values()):
            raise click.UsageError(f"{_WHICH}, not both")
        record, page = _session_page(store, session, count)
        heading = f"session {record.id} · owner {record.owner or '-'} · {record.status}" + (
            f" · {record.title}" if record.title else "")
        console.print(Text(printable(heading), style="bold"))  # stored text, never markup
    elif scope is None or key is None:
        raise click.UsageError(_WHICH)
    else:
        page = _scope_page(store, scope, key, count, ids)
    if page.before is not None:
        paging = "" if session else f"; or page with flowmem history --before {page.before}"
        console.print(Text(f"… older messages not shown (--all shows them{paging})",
                           style="dim"))
    console.print(render_transcript(page.messages, page.positions))


def register(group: click.Group) -> None:
    """Add ``transcript`` to the ``flowmem`` group."""
    group.add_command(transcript)
