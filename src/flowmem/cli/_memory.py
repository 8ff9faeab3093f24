"""``flowmem`` commands over :class:`~flowmem.Memory`: read, write, delete, append,
history, and the pure ``normalize``.

Each is a thin layer over the coordinator, so the refusals (MEM-6, MEM-7,
MEM-13) and the append rules (MEM-1..14) hold exactly as in a runtime. The
execution context comes from options (``--user``, ``--session``,
``--workflow``, ...): this is an operator's tool with direct access to the
store, not the authenticated HTTP service. Output is JSON on stdout; a
refusal exits 3, invalid input exits 1 with the error on stderr (the
conventions and the shared options are in :mod:`flowmem.cli._common`).
"""

from __future__ import annotations

from typing import Any

import click

from .. import formats
from ..memory import Memory
from ..normalize import normalize
from ._common import context_of as _context
from ._common import echo_json as _echo
from ._common import json_argument as _json_argument
from ._common import run as _run
from ._common import where as _where
from ._formats import unwrap

__all__ = ["register"]


@click.command("read")
@_where
def read(store: str | None, scope: str, key: str, **ids: Any) -> None:
    """Read a key (a conversation reads as its message list)."""
    _run(store, lambda m: _as_dict(m.read(scope, key, context=_context(ids))))


_IDEMPOTENCY = click.option(
    "--idempotency-key", "idem", default=None, metavar="KEY",
    help="Retry safely: the same KEY with the same input changes nothing the second time "
         "(kept 24 h).")


@click.command("write")
@_where
@_IDEMPOTENCY
@click.option("--replace", is_flag=True, default=False,
              help="Replace a conversation the key holds by VALUE (without it that is a "
                   "conflict, exit 5, and nothing changes).")
@click.argument("value", required=False)
def write(store: str | None, scope: str, key: str, idem: str | None, replace: bool,
          value: str | None, **ids: Any) -> None:
    """Write a JSON VALUE (or JSON from stdin) to a key."""
    parsed = _json_argument(value, "VALUE")
    _run(store, lambda m: _as_dict(m.write(scope, key, parsed, context=_context(ids),
                                           idempotency_key=idem, replace=replace)))


@click.command("delete")
@_where
@_IDEMPOTENCY
def delete(store: str | None, scope: str, key: str, idem: str | None, **ids: Any) -> None:
    """Delete a key (a value or a conversation)."""
    _run(store, lambda m: _as_dict(m.delete(scope, key, context=_context(ids),
                                            idempotency_key=idem)))


@click.command("append")
@_where
@click.option("--max-messages", type=click.IntRange(1), default=None, metavar="N",
              help="Window size: keep the newest N entries (oldest evicted). Default: no window.")
@click.option("--format", "fmt", type=click.Choice(formats.FORMATS), default="canonical",
              show_default=True, help="The dialect MESSAGES are written in (docs/formats.md).")
@_IDEMPOTENCY
@click.argument("messages", required=False)
def append(store: str | None, scope: str, key: str, max_messages: int | None, fmt: str,
           idem: str | None, messages: str | None, **ids: Any) -> None:
    """Append MESSAGES (a JSON message or list; stdin when omitted) with MEM-1..14."""
    incoming = _json_argument(messages, "MESSAGES")

    def work(memory: Memory) -> dict[str, Any]:
        result = memory.append(scope, key, incoming, context=_context(ids), format=fmt,
                               max_messages=max_messages, idempotency_key=idem)
        return {"scope": result.scope, "resolved_scope_id": result.resolved_scope_id,
                "refused": result.refused, "replayed": result.replayed, **result.to_dict()}

    _run(store, work)


@click.command("history")
@_where
@click.option("--last", type=click.IntRange(0), default=50, show_default=True,
              help="How many messages (the newest ones before --before).")
@click.option("--before", type=int, default=None, metavar="POSITION",
              help="Page further back: the `before` cursor a previous page printed.")
@click.option("--format", "fmt", type=click.Choice(formats.FORMATS), default="canonical",
              show_default=True, help="Print the messages as a provider takes them "
              "(sendable, MEM-5; see docs/formats.md).")
@click.option("--max-tokens", type=click.IntRange(1), default=None, metavar="N",
              help="Instead of --last: the newest whole turns within N tokens (counted "
              "approximately, in the --format dialect; see docs/context.md).")
def history(store: str | None, scope: str, key: str, last: int, before: int | None,
            fmt: str, max_tokens: int | None, **ids: Any) -> None:
    """The last messages of a conversation, oldest first, with their positions
    (or, with --format, as a provider takes them)."""
    def work(memory: Memory) -> dict[str, Any]:
        if max_tokens is not None:
            page = memory.history(scope, key, context=_context(ids), max_tokens=max_tokens,
                                  format=fmt)
        else:
            page = memory.history(scope, key, context=_context(ids), last=last, before=before)
        head = {"scope": page.scope, "resolved_scope_id": page.resolved_scope_id,
                "refused": page.refused, "before": page.before}
        if max_tokens is not None:
            head.update(tokens=page.tokens, omitted=page.omitted)
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
