"""``flowmem export`` and ``flowmem import``: conversations and values as JSON Lines.

A thin layer over :mod:`flowmem.transfer` (the line format is in
``docs/cli.md``). Export streams page by page, so a 1,000,000-message
conversation exports in bounded memory; import checks every line before it
changes anything, then appends in batches through ``Memory.append`` (the
rules MEM-1..14 apply). Progress goes to stderr; data to stdout or a file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any, NoReturn

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from ..errors import FlowmemError, ScopeRefused
from ..transfer import BATCH, export_lines, import_lines, parse_line, scope_keys
from ._common import (
    REFUSED_EXIT,
    context_of,
    context_options,
    echo_json,
    flowmem_errors,
    open_memory,
    scope_option,
    store_option,
)

__all__ = ["export_command", "import_command", "register"]

_PROGRESS_HELP = "Show progress on stderr (default: only when stderr is a terminal)."


@contextlib.contextmanager
def _progress(enabled: bool | None, what: str,
              total: int | None) -> Iterator[Callable[[int], None]]:
    """A callable advancing a progress bar on stderr by n, or doing nothing."""
    console = Console(stderr=True)
    if enabled is None:
        enabled = console.is_terminal
    if not enabled:
        yield lambda _n: None
        return
    columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
               MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=console) as progress:
        task = progress.add_task(what, total=total)
        yield lambda n: progress.advance(task, n)


def _refused(scope: str, reason: str) -> NoReturn:
    click.echo(f"flowmem: {scope} scope refused ({reason}); nothing exported", err=True)
    echo_json({"scope": scope, "resolved_scope_id": "", "refused": True})
    sys.exit(REFUSED_EXIT)


@click.command("export")
@store_option
@scope_option
@click.option("--key", "keys", multiple=True, metavar="KEY",
              help="Export this key (repeatable). Default: every key under the scope id.")
@context_options
@click.option("--output", "-o", default="-", metavar="FILE", show_default=True,
              type=click.Path(dir_okay=False, writable=True, allow_dash=True),
              help="Where to write the JSON Lines ('-': stdout).")
@click.option("--progress/--no-progress", default=None, help=_PROGRESS_HELP)
def export_command(store: str | None, scope: str, keys: tuple[str, ...], output: str,
                   progress: bool | None, **ids: Any) -> None:
    """Write conversations (one line per message, oldest first) and values as JSON Lines."""
    context = context_of(ids)
    memory = open_memory(store)
    with flowmem_errors(), memory:
        if keys:
            probe = memory.history(scope, keys[0], context=context, last=0)
            if probe.refused:
                _refused(scope, "no usable id in the context")
            chosen: Iterable[str] = keys
        else:
            try:
                _, chosen = scope_keys(memory, scope, context)
            except ScopeRefused as refusal:
                _refused(scope, refusal.reason)
        with _open_output(output) as sink, \
                _progress(progress, f"export {scope}", None) as advance:
            for line in export_lines(memory, scope, chosen, context, progress=advance):
                sink.write(line + "\n")


@contextlib.contextmanager
def _open_output(output: str) -> Iterator[IO[str]]:
    """stdout, or a temporary file beside ``output`` renamed over it once the export is
    whole: an interrupted or failed export leaves an earlier ``output`` untouched."""
    if output == "-":  # no marker in the lines: an unfinished export says so on stderr
        try:
            yield sys.stdout
        except BaseException:
            click.echo("flowmem: export interrupted; the lines already on stdout are not the "
                       "whole export", err=True)
            raise
        return
    folder, name = os.path.split(os.path.abspath(output))
    try:  # 0600 from its creation, like the database: it holds it all
        descriptor, partial = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=folder)
    except OSError as exc:
        raise click.ClickException(f"cannot write {output}: {exc.strerror or exc}") from None
    done = False
    try:
        with open(descriptor, "w", encoding="utf-8", newline="\n") as sink:
            yield sink
            sink.flush()
            os.fsync(sink.fileno())
        os.replace(partial, output)
        done = True
    except OSError as exc:
        raise click.ClickException(f"cannot write {output}: {exc.strerror or exc}; "
                                   f"{output} was left as it was") from None
    except BaseException:
        click.echo(f"flowmem: export interrupted; {output} was left as it was "
                   "(nothing of this export is in it)", err=True)
        raise
    finally:
        if not done:
            with contextlib.suppress(OSError):
                os.unlink(partial)


@contextlib.contextmanager
def _seekable(source: IO[str]) -> Iterator[IO[str]]:
    """``source`` itself when it can be read twice, else a temporary copy (stdin)."""
    try:
        seekable = source.seekable()
    except (OSError, ValueError):
        seekable = False
    if seekable:
        yield source
        return
    with tempfile.TemporaryFile("w+", encoding="utf-8", newline="\n") as spool:
        shutil.copyfileobj(source, spool)
        spool.seek(0)
        yield spool


def _check(source: IO[str]) -> int:
    """Validate every line before anything changes; how many message lines there are."""
    messages = 0
    for number, text in enumerate(source, 1):
        if text.strip() and parse_line(text, number)["kind"] == "message":
            messages += 1
    return messages


@click.command("import")
@store_option
@click.argument("source", type=click.File("r", encoding="utf-8"), default="-")
@click.option("--batch", type=click.IntRange(1, 100_000), default=BATCH, show_default=True,
              help="Messages appended per Memory.append call.")
@click.option("--progress/--no-progress", default=None, help=_PROGRESS_HELP)
def import_command(store: str | None, source: IO[str], batch: int,
                   progress: bool | None) -> None:
    """Append the JSON Lines of SOURCE (a file, or '-' for stdin) to the store.

    Every line is checked first: on a bad line nothing is imported. Messages
    are appended with the full rules (MEM-1..14): into a fresh store this
    copies each history exactly; into one that already holds a conversation,
    its results and declaring turns are recognised (MEM-1, MEM-2) but turns
    without call ids (user turns) are appended again.
    """
    try:
        with _seekable(source) as readable:
            try:
                total = _check(readable)
            except FlowmemError as exc:
                raise click.ClickException(f"{exc}; nothing was imported") from None
            readable.seek(0)
            memory = open_memory(store)
            done = [0]

            def advanced(n: int) -> None:
                done[0] += n
                advance(n)

            with flowmem_errors(), memory, _progress(progress, "import", total) as advance:
                try:
                    summary = import_lines(memory, readable, batch=batch, progress=advanced)
                except KeyboardInterrupt:
                    click.echo(f"flowmem: import interrupted after {done[0]} of {total} "
                               "messages; run the same command again (same file, same "
                               "--batch, within 24 h): it stores each message exactly once",
                               err=True)
                    raise
    except UnicodeDecodeError as exc:
        raise click.ClickException(f"SOURCE is not UTF-8 text ({exc.reason}); "
                                   "nothing was imported") from None
    click.echo(f"flowmem: imported {summary.messages} messages in {summary.conversations} "
               f"conversations ({summary.appended} appended, {summary.replayed} already "
               f"stored by an earlier run) and {summary.values} values", err=True)
    echo_json(vars(summary))


def register(group: click.Group) -> None:
    """Add ``export`` and ``import`` to the ``flowmem`` group."""
    group.add_command(export_command)
    group.add_command(import_command)
