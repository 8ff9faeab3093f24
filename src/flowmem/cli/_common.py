"""What every ``flowmem`` memory command shares: the options naming a memory,
JSON input, opening the store, and the exit-code conventions.

Conventions (all commands): output on stdout, messages and warnings on
stderr, never a traceback; the exit codes are the one table of
:mod:`flowmem.cli._exit` (0 ok, 1 error, 2 usage, 3 refused scope, 4 store
unavailable, 5 conflict), every error one line.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final, TypeVar

import click

from ..errors import FlowmemError
from ..memory import Memory
from ..messages import MAX_JSON_DEPTH
from ..scopes import SCOPES, ExecutionContext
from ._exit import REFUSED, cli_error

__all__ = [
    "MAX_INPUT_DEPTH",
    "REFUSED_EXIT",
    "STORE_HELP",
    "context_of",
    "context_options",
    "echo_json",
    "flowmem_errors",
    "json_argument",
    "open_memory",
    "run",
    "scope_option",
    "store_option",
    "warn_shared_bucket",
    "where",
]

F = TypeVar("F", bound=Callable[..., Any])
REFUSED_EXIT: Final = REFUSED
STORE_HELP: Final = "Store URL (default: $FLOWMEM_STORE or sqlite:///flowmem.db)."
MAX_INPUT_DEPTH: Final = MAX_JSON_DEPTH + 2
"""Deepest JSON the CLI parses: a list of messages whose fields nest MAX_JSON_DEPTH deep."""

_ID_OPTION: Final = {"workflow": "--workflow", "pipeline": "--pipeline",
                     "execution": "--execution"}


def context_options(command: F) -> F:
    """The options describing the execution context (``--user``, ``--session``, …)."""
    options = [
        click.option("--user", "user_id", default=None, metavar="ID",
                     help="The memory principal: the user id of --scope user (MEM-8)."),
        click.option("--session", "session_id", default=None, metavar="ID",
                     help="The session id of --scope session (MEM-13)."),
        click.option("--workflow", "workflow_id", default=None, metavar="ID",
                     help="The workflow id of --scope workflow (named in refusal warnings)."),
        click.option("--pipeline", "pipeline_id", default=None, metavar="ID",
                     help="The pipeline id of --scope pipeline (named in refusal warnings)."),
        click.option("--execution", "execution_id", default=None, metavar="ID",
                     help="The execution id of --scope execution."),
        click.option("--node", "node_id", default=None, metavar="ID",
                     help="The node id named in a refusal warning (MEM-7)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


store_option = click.option("--store", default=None, metavar="URL", help=STORE_HELP)
scope_option = click.option(
    "--scope", required=True, type=click.Choice(SCOPES),
    help="Where the memory lives; user and session need --user/--session (MEM-6, MEM-13), "
         "workflow/pipeline/execution use their id.")


def where(command: F) -> F:
    """The options naming a memory: store, scope, key and the execution context."""
    command = context_options(command)
    command = click.option("--key", required=True,
                           help="The memory key (a conversation's name).")(command)
    return store_option(scope_option(command))


def context_of(ids: Mapping[str, Any]) -> ExecutionContext:
    """The execution context the ``--user``/``--session``/… options describe."""
    return ExecutionContext(**ids)


def echo_json(data: Any) -> None:
    """``data`` as indented JSON on stdout."""
    click.echo(json.dumps(data, ensure_ascii=True, indent=2))


def _too_deep(value: Any, limit: int) -> bool:
    """Whether ``value`` nests more than ``limit`` containers (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item \
            if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def json_argument(text: str | None, what: str) -> Any:
    """Parse ``text`` (stdin when ``None`` or ``-``) as JSON nested at most MAX_INPUT_DEPTH."""
    if text in (None, "-") and sys.stdin.isatty():  # say what the wait is for
        click.echo(f"flowmem: reading {what} from stdin (end with Ctrl-D)", err=True)
    raw = sys.stdin.read() if text in (None, "-") else text
    too_deep = f"{what} is nested deeper than {MAX_INPUT_DEPTH} levels"
    try:
        parsed = json.loads(raw)
    except RecursionError:
        raise click.ClickException(too_deep) from None
    except ValueError as exc:
        raise click.BadParameter(f"{what} is not JSON: {exc}") from None
    if _too_deep(parsed, MAX_INPUT_DEPTH):
        raise click.ClickException(too_deep)
    return parsed


def open_memory(store: str | None) -> Memory:
    """The :class:`Memory` over ``store``, or a clean ``Error:`` (exit 1)."""
    try:
        return Memory.from_url(store)
    except FlowmemError as exc:
        raise cli_error(exc) from None


@contextmanager
def flowmem_errors() -> Iterator[None]:
    """Turn any :class:`FlowmemError` into a clean ``Error:`` line (exit 1)."""
    try:
        yield
    except FlowmemError as exc:
        raise cli_error(exc) from None


def warn_shared_bucket(scope: str, resolved_scope_id: str, refused: bool) -> None:
    """Say on stderr when a workflow/pipeline/execution scope fell to the shared bucket."""
    option = _ID_OPTION.get(scope)
    if option is not None and resolved_scope_id == "" and not refused:
        click.echo(f'warning: --scope {scope} without a usable {option} uses the shared '
                   f'bucket "" (one key for every {scope})', err=True)


def run(store: str | None, work: Callable[[Memory], dict[str, Any]]) -> None:
    """Run ``work`` on the store, print its JSON result, exit 3 on a refusal."""
    memory = open_memory(store)
    with flowmem_errors(), memory:
        result = work(memory)
    warn_shared_bucket(result.get("scope", ""), result.get("resolved_scope_id", ""),
                       bool(result.get("refused")))
    echo_json(result)
    if result.get("refused"):
        sys.exit(REFUSED_EXIT)


