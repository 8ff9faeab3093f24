"""``flowmem convert`` and ``flowmem check``: provider transcripts on the command line.

``convert --from X --to Y [FILE|-]`` reads a transcript (JSON or JSONL) in one
format and prints it in another, sendable (:func:`flowmem.formats.render`,
MEM-5); what the target cannot carry is counted on stderr. ``check [--format
X] [--fix] FILE`` is a linter: exit 0 when the provider would accept the
transcript, else exit 1 with one line per problem (index, rule, what is
wrong); ``--fix`` writes the repaired transcript (back to FILE, or stdout
for ``-``). Both also read what ``flowmem history`` prints.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

import click

from .. import formats
from ..errors import FlowmemError

__all__ = ["read_transcript", "register", "unwrap"]

_FORMAT = click.Choice(formats.FORMATS)


def unwrap(data: Any) -> Any:
    """A transcript from what ``flowmem history`` prints, or ``data`` itself.

    History's envelope ``{"messages": [{"position", "message"}, ...]}`` gives
    the messages; with ``--format`` the envelope's ``messages`` (and, for
    Anthropic, ``system``) are the provider payload.
    """
    if not isinstance(data, Mapping) or not isinstance(data.get("messages"), list):
        return data
    messages = data["messages"]
    if messages and all(isinstance(m, Mapping) and set(m) == {"position", "message"}
                        for m in messages):
        return [m["message"] for m in messages]
    if "system" in data or data.get("format") == "anthropic":
        return {key: data[key] for key in ("system", "messages") if key in data}
    return messages if "format" in data or "scope" in data else data


def read_transcript(source: str | None) -> tuple[Any, bool]:
    """JSON (or JSONL: one value per line) from FILE or stdin; ``(data, was_jsonl)``."""
    try:
        if source in (None, "-"):
            text = sys.stdin.read()
        else:
            with open(source, encoding="utf-8") as handle:
                text = handle.read()
    except OSError as exc:
        raise click.ClickException(f"cannot read {source}: {exc.strerror}") from None
    try:
        return unwrap(json.loads(text)), False
    except ValueError:
        pass
    lines = [line for line in text.splitlines() if line.strip()]
    try:
        return [json.loads(line) for line in lines], True
    except ValueError as exc:
        raise click.ClickException(f"{source or 'stdin'} is neither JSON nor JSONL: {exc}") \
            from None


def guess_format(data: Any) -> str:
    """The format a transcript is most likely in (for ``check`` without ``--format``)."""
    if isinstance(data, Mapping):
        return "anthropic"
    items = data if isinstance(data, list) else []
    if any(isinstance(m, Mapping) and "role" not in m and "type" in m for m in items):
        return "responses"
    if any(isinstance(m, Mapping) and "metadata" in m for m in items):
        return "canonical"
    blocks = [b for m in items if isinstance(m, Mapping) and isinstance(m.get("content"), list)
              for b in m["content"] if isinstance(b, Mapping)]
    if any(b.get("type") in ("tool_use", "tool_result", "thinking") for b in blocks):
        return "anthropic"
    return "openai"


def _render(data: Any, source: str, target: str) -> formats.Rendered:
    try:
        return formats.render(formats.to_canonical(data, source), target)
    except FlowmemError as exc:
        raise click.ClickException(str(exc)) from None


def _dump(value: Any, jsonl: bool) -> str:
    if jsonl and isinstance(value, list):
        return "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in value)
    return json.dumps(value, ensure_ascii=False, indent=2) + "\n"


def _report_dropped(rendered: formats.Rendered) -> None:
    if rendered.dropped:
        detail = ", ".join(f"{what}: {n}" for what, n in sorted(rendered.lost.items()))
        click.echo(f"dropped {rendered.dropped}" + (f" ({detail})" if detail else ""), err=True)


@click.command("convert")
@click.option("--from", "source", required=True, type=_FORMAT, help="Format of the input.")
@click.option("--to", "target", required=True, type=_FORMAT, help="Format to print.")
@click.argument("file", required=False)
def convert(source: str, target: str, file: str | None) -> None:
    """Print FILE (JSON or JSONL; stdin when omitted or -) converted, sendable (MEM-5)."""
    data, jsonl = read_transcript(file)
    rendered = _render(data, source, target)
    click.echo(_dump(rendered.output, jsonl), nl=False)
    _report_dropped(rendered)


@click.command("check")
@click.option("--format", "fmt", type=_FORMAT, default=None,
              help="Format of the transcript (guessed when omitted).")
@click.option("--fix", is_flag=True, help="Write the repaired transcript (FILE, or stdout).")
@click.argument("file")
def check(fmt: str | None, fix: bool, file: str) -> None:
    """Exit 0 if a provider would accept FILE, else 1 with one line per problem."""
    data, jsonl = read_transcript(file)
    fmt = fmt or guess_format(data)
    try:
        problems = [str(p) for p in formats.check(data, fmt)]
        formats.to_canonical(data, fmt)
    except FlowmemError as exc:
        problems = [f"{getattr(exc, 'index', None) or 0}: {fmt}.shape: {exc}"]
    if not fix:
        for line in problems:
            click.echo(line)
        sys.exit(1 if problems else 0)
    for line in problems:
        click.echo(line, err=True)
    rendered = _render(data, fmt, "openai" if fmt == "canonical" else fmt)
    fixed = formats.from_openai_chat(rendered.output) if fmt == "canonical" else rendered.output
    text = _dump(fixed, jsonl)
    if file == "-":
        click.echo(text, nl=False)
    else:
        with open(file, "w", encoding="utf-8") as handle:
            handle.write(text)
    _report_dropped(rendered)


def register(group: click.Group) -> None:
    """Add ``convert`` and ``check`` to the ``flowmem`` group."""
    group.add_command(convert)
    group.add_command(check)
