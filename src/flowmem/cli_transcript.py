"""``flowmem transcript``: a conversation as a readable, coloured transcript.

A thin layer: ``Memory.history`` reads the page, :func:`flowmem.render.render_transcript`
(pure) draws it, ``rich`` prints it. Colours follow the terminal unless
``--color``/``--no-color`` says otherwise (``NO_COLOR`` is honoured).
"""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.console import Console

from .cli_common import (
    REFUSED_EXIT,
    context_of,
    flowmem_errors,
    open_memory,
    warn_shared_bucket,
    where,
)
from .render import render_transcript

__all__ = ["register", "transcript"]


@click.command("transcript")
@where
@click.option("--last", type=click.IntRange(1), default=100, show_default=True,
              help="How many of the newest messages to show.")
@click.option("--all", "everything", is_flag=True,
              help="Show the whole conversation (overrides --last).")
@click.option("--color/--no-color", default=None,
              help="Force colours on or off (default: on for a terminal).")
@click.option("--width", type=click.IntRange(40, 1000), default=None,
              help="Line width (default: the terminal's).")
def transcript(store: str | None, scope: str, key: str, last: int, everything: bool,
               color: bool | None, width: int | None, **ids: Any) -> None:
    """Print a conversation: roles, tool-call cards with their results, healed and
    late entries marked (MEM-3, MEM-10)."""
    context = context_of(ids)
    count = None if everything else last
    memory = open_memory(store)
    with flowmem_errors(), memory:
        page = memory.history(scope, key, context=context, last=count)
    if page.refused:
        click.echo(f"flowmem: {scope} scope refused; nothing to show", err=True)
        sys.exit(REFUSED_EXIT)
    warn_shared_bucket(page.scope, page.resolved_scope_id, page.refused)
    console = Console(width=width, force_terminal=color,
                      no_color=None if color is None else not color, highlight=False)
    if page.before is not None:
        console.print(f"… older messages not shown (--all shows them; or page with "
                      f"flowmem history --before {page.before})", style="dim")
    console.print(render_transcript(page.messages, page.positions))


def register(group: click.Group) -> None:
    """Add ``transcript`` to the ``flowmem`` group."""
    group.add_command(transcript)
