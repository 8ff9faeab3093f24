"""``flowmem`` commands over :class:`~flowmem.Memory`: read, write, delete, append,
history, and the pure ``normalize``.

Each is a thin layer over the coordinator, so the refusals (MEM-6, MEM-7,
MEM-13) and the append rules (MEM-1..14) hold exactly as in a runtime. The
execution context comes from options (``--user``, ``--session``,
``--workflow``, ...): this is an operator's tool with direct access to the
store, not the authenticated HTTP service. Output is JSON on stdout; a
refusal exits 3, invalid input exits 1 with the error on stderr.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from . import formats
from .cli_formats import unwrap
from .errors import FlowmemError
from .memory import Memory
from .normalize import normalize
from .scopes import SCOPES, ExecutionContext

__all__ = ["register"]

F = TypeVar("F", bound=Callable[..., Any])
REFUSED_EXIT = 3


def _where(command: F) -> F:
    """The options naming a memory: store, scope, key and the execution context."""
    options = [
        click.option("--store", default=None,
                     help="Store URL (default: $FLOWMEM_STORE or sqlite:///flowmem.db)."),
        click.option("--scope", required=True, type=click.Choice(SCOPES)),
        click.option("--key", required=True, help="The memory key."),
        click.option("--user", "user_id", default=None, help="The memory principal (MEM-8)."),
        click.option("--session", "session_id", default=None),
        click.option("--workflow", "workflow_id", default=None),
        click.option("--pipeline", "pipeline_id", default=None),
        click.option("--execution", "execution_id", default=None),
        click.option("--node", "node_id", default=None),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _echo(data: Any) -> None:
    click.echo(json.dumps(data, ensure_ascii=True, indent=2))


def _json_argument(text: str | None, what: str) -> Any:
    raw = sys.stdin.read() if text in (None, "-") else text
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise click.BadParameter(f"{what} is not JSON: {exc}") from None


def _run(store: str | None, work: Callable[[Memory], dict[str, Any]]) -> None:
    try:
        with Memory.from_url(store) as memory:
            result = work(memory)
    except FlowmemError as exc:
        raise click.ClickException(str(exc)) from None
    _echo(result)
    if result.get("refused"):
        sys.exit(REFUSED_EXIT)


def _context(ids: dict[str, Any]) -> ExecutionContext:
    return ExecutionContext(**ids)


@click.command("read")
@_where
def read(store: str | None, scope: str, key: str, **ids: Any) -> None:
    """Read a key (a conversation reads as its message list)."""
    _run(store, lambda m: _as_dict(m.read(scope, key, context=_context(ids))))


@click.command("write")
@_where
@click.argument("value", required=False)
def write(store: str | None, scope: str, key: str, value: str | None, **ids: Any) -> None:
    """Write a JSON VALUE (or JSON from stdin) to a key."""
    parsed = _json_argument(value, "VALUE")
    _run(store, lambda m: _as_dict(m.write(scope, key, parsed, context=_context(ids))))


@click.command("delete")
@_where
def delete(store: str | None, scope: str, key: str, **ids: Any) -> None:
    """Delete a key (a value or a conversation)."""
    _run(store, lambda m: _as_dict(m.delete(scope, key, context=_context(ids))))


@click.command("append")
@_where
@click.option("--max-messages", type=int, default=None, help="Window size (oldest evicted).")
@click.option("--format", "fmt", type=click.Choice(formats.FORMATS), default="canonical",
              show_default=True, help="The dialect MESSAGES are written in.")
@click.argument("messages", required=False)
def append(store: str | None, scope: str, key: str, max_messages: int | None, fmt: str,
           messages: str | None, **ids: Any) -> None:
    """Append MESSAGES (a JSON message or list; stdin when omitted) with MEM-1..14."""
    incoming = _json_argument(messages, "MESSAGES")

    def work(memory: Memory) -> dict[str, Any]:
        canonical = formats.to_canonical(incoming, fmt) if fmt != "canonical" else incoming
        result = memory.append(scope, key, canonical, context=_context(ids),
                               max_messages=max_messages)
        return {"scope": result.scope, "resolved_scope_id": result.resolved_scope_id,
                "refused": result.refused, **result.to_dict()}

    _run(store, work)


@click.command("history")
@_where
@click.option("--last", type=click.IntRange(0), default=50, show_default=True)
@click.option("--before", type=int, default=None, help="The `before` cursor of a later page.")
@click.option("--format", "fmt", type=click.Choice(formats.FORMATS), default="canonical",
              show_default=True, help="Print the messages as a provider takes them "
              "(sendable, MEM-5; see docs/formats.md).")
def history(store: str | None, scope: str, key: str, last: int, before: int | None,
            fmt: str, **ids: Any) -> None:
    """The last messages of a conversation, oldest first, with their positions
    (or, with --format, as a provider takes them)."""
    def work(memory: Memory) -> dict[str, Any]:
        page = memory.history(scope, key, context=_context(ids), last=last, before=before)
        head = {"scope": page.scope, "resolved_scope_id": page.resolved_scope_id,
                "refused": page.refused, "before": page.before}
        if fmt != "canonical":
            rendered = formats.render(page.messages, fmt)
            output = rendered.output if fmt == "anthropic" else {"messages": rendered.output}
            return {**head, "format": fmt, "dropped": rendered.dropped, **output}
        return {**head, "messages": [{"position": p, "message": m}
                                     for p, m in zip(page.positions, page.messages,
                                                     strict=True)]}

    _run(store, work)


@click.command("normalize")
@click.argument("messages", required=False)
def normalize_command(messages: str | None) -> None:
    """Print MESSAGES (JSON; stdin when omitted) as a provider-sendable list (MEM-5).

    Also reads what ``flowmem history`` prints."""
    result = normalize(unwrap(_json_argument(messages, "MESSAGES")))
    _echo({"messages": result.messages, "dropped": result.dropped})


def _as_dict(result: Any) -> dict[str, Any]:
    return {name: getattr(result, name) for name in result.__dataclass_fields__}


def register(group: click.Group) -> None:
    """Add the memory commands to the ``flowmem`` group."""
    for command in (read, write, delete, append, history, normalize_command):
        group.add_command(command)
