"""The ONE exit-code table of the ``flowmem`` command, and its one-line errors.

=====  ==============================================================
code   meaning
=====  ==============================================================
0      success
1      an error: invalid input, a failure, an answer that is "no"
2      a usage error: a missing or malformed option or argument
3      the scope was refused (MEM-6, MEM-7, MEM-13): nothing was read
       or stored
4      the store is unavailable: unreachable, busy, or read-only
5      a conflict: the key holds the other kind of value, an
       idempotency key was reused for another request
=====  ==============================================================

Every error is ONE line on stderr (``Error: …``, a usage error
naming the command's ``--help``), never click's multi-line usage block and
never a traceback. ``docs/cli.md`` publishes the table; a test runs every
command against it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Final, NoReturn

import click

from ..errors import (
    FlowmemError,
    IdempotencyConflict,
    KeyConflict,
    StoreBusy,
    StoreReadOnly,
    StoreUnavailable,
)

__all__ = ["CONFLICT", "ERROR", "OK", "REFUSED", "STORE_UNAVAILABLE", "USAGE", "CliError",
           "FlowmemGroup", "cli_error", "one_line"]

OK: Final = 0
ERROR: Final = 1
USAGE: Final = 2
REFUSED: Final = 3
STORE_UNAVAILABLE: Final = 4
CONFLICT: Final = 5


class CliError(click.ClickException):
    """A one-line error with its exit code from the table."""

    def __init__(self, message: str, exit_code: int = ERROR) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # per instance: the table's code


def cli_error(exc: FlowmemError) -> CliError:
    """A library error as the CLI's error, with the table's code for its class."""
    if isinstance(exc, StoreUnavailable | StoreBusy | StoreReadOnly):
        return CliError(str(exc), STORE_UNAVAILABLE)
    if isinstance(exc, KeyConflict | IdempotencyConflict):
        return CliError(str(exc), CONFLICT)
    return CliError(str(exc), ERROR)


def one_line(text: str) -> str:
    """``text`` on one line (newlines become spaces)."""
    return " ".join(text.split())


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"Error: {one_line(message)}", err=True)
    sys.exit(code)


class FlowmemGroup(click.Group):
    """The ``flowmem`` group: every error one line on stderr, every code from the table."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        try:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else "flowmem"
            _fail(f"{exc.format_message()} (see '{where} --help')", USAGE)
        except click.ClickException as exc:
            _fail(exc.format_message(), exc.exit_code)
        except FlowmemError as exc:
            error = cli_error(exc)
            _fail(error.format_message(), error.exit_code)
        except click.exceptions.Abort:
            _fail("aborted", ERROR)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
