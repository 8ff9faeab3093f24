"""A readable transcript of a conversation, as ``rich`` renderables (no I/O).

:func:`render_transcript` is a pure function over a message list (canonical
or provider-flat; ids read through :mod:`flowmem.ids`, MEM-11): each message
a panel coloured by role; each tool call a card inside its assistant turn
with its arguments and, paired by call id, its result. What the rules did is
marked on the card: a healed placeholder (MEM-3: the call was interrupted)
and, when the stored positions are given, a late result that replaced its
placeholder in place (MEM-10: it sits at an inserted position, not an
appended one). A result that pairs with no call in view is shown on its own.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.text import Text

from .ids import call_entries, call_id, is_healed, result_id
from .plan import SLOT

__all__ = ["ROLE_STYLES", "render_text", "render_transcript"]

# Stored text made safe for a terminal: anyone holding a token can store any
# text, and a terminal obeys the escape sequences it prints (clear the screen,
# OSC 0 titles, OSC 52 clipboard writes, bidirectional overrides). Every
# human-facing output (the CLI's tables, the transcript) passes it through
# printable first.
_BIDI: Final = (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C)
_CONTROLS: Final = (*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0), *_BIDI)


def _escaped(code: int) -> str:
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_TABLE: Final = {code: _escaped(code) for code in _CONTROLS}
_TABLE_LINES: Final = {code: text for code, text in _TABLE.items() if code not in (0x0A, 0x09)}


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` with every control character shown escaped (``\\x1b``, ``\\u202e``).

    ``lines=True`` keeps newlines and tabs (a message's content); otherwise they
    are escaped too (a table cell, a title: one line).
    """
    return text.translate(_TABLE_LINES if lines else _TABLE)


ROLE_STYLES: Final = {"system": "magenta", "user": "green", "assistant": "blue",
                      "tool": "yellow"}
HEALED_NOTE: Final = "interrupted: healed placeholder (MEM-3)"
LATE_NOTE: Final = "late result: replaced its placeholder in place (MEM-10)"


def _text(value: Any) -> str:
    """Content or arguments as display text (JSON text pretty-printed when it parses),
    control characters shown escaped (:func:`printable`)."""
    return printable(_plain(value), lines=True)


def _plain(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        if not isinstance(parsed, dict | list):
            return value
        value = parsed
    try:
        return json.dumps(value, indent=2, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def _content(message: Mapping[str, Any]) -> str:
    value = message.get("content")
    return printable(value, lines=True) if isinstance(value, str) else _text(value)


def _call_name(entry: Mapping[str, Any]) -> tuple[str, Any]:
    """A call entry's function name and arguments, in either provider shape."""
    function = entry.get("function")
    if isinstance(function, Mapping):
        return printable(str(function.get("name") or "?")), function.get("arguments")
    return printable(str(entry.get("name") or "?")), entry.get("arguments")


@dataclass
class _Pairing:
    """Which result answers which call: ``answer[call id] = index of its result``."""

    answer: dict[str, int] = field(default_factory=dict)
    shown: set[int] = field(default_factory=set)


def _pair(messages: Sequence[Mapping[str, Any]]) -> _Pairing:
    """Pair each declared call with the first later result carrying its id."""
    pairing = _Pairing()
    open_calls: set[str] = set()
    for index, message in enumerate(messages):
        for entry in call_entries(message):
            found = call_id(entry)
            if found is not None and found not in pairing.answer:
                open_calls.add(found)
        answered = result_id(message)
        if answered in open_calls:
            open_calls.discard(answered)
            pairing.answer[answered] = index
            pairing.shown.add(index)
    return pairing


def _is_late(positions: Sequence[int] | None, index: int, message: Mapping[str, Any]) -> bool:
    """A real result at an inserted (placeholder) position replaced its placeholder."""
    return (positions is not None and positions[index] % SLOT != 0
            and not is_healed(message))


def _result_body(messages: Sequence[Mapping[str, Any]], positions: Sequence[int] | None,
                 index: int | None) -> tuple[Text, str]:
    """The result part of a call card, and the card's border style."""
    if index is None:
        return Text("no result yet", style="dim italic"), "dim"
    result = messages[index]
    body = Text()
    if is_healed(result):
        body.append(f"⚠ {HEALED_NOTE}\n", style="bold yellow")
        style = "yellow"
    elif _is_late(positions, index, result):
        body.append(f"↻ {LATE_NOTE}\n", style="bold cyan")
        style = "cyan"
    else:
        style = "bright_black"
    body.append(_content(result))
    return body, style


def _call_card(entry: Mapping[str, Any], messages: Sequence[Mapping[str, Any]],
               positions: Sequence[int] | None, pairing: _Pairing) -> Panel:
    name, arguments = _call_name(entry)
    found = call_id(entry)
    result, style = _result_body(messages, positions,
                                 pairing.answer.get(found) if found else None)
    body = Text()
    body.append("arguments\n", style="bold")
    body.append(_text(arguments) or "(none)")
    shown = printable(found) if found else "(no usable id)"
    body.append("\n\nresult\n", style="bold")
    body.append_text(result)
    title = Text.assemble(("⚙ ", style), (name, "bold"), (f"  id {shown}", "dim"))
    return Panel(body, title=title, title_align="left", border_style=style)


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _panel(messages: Sequence[Mapping[str, Any]], positions: Sequence[int] | None,
           index: int, pairing: _Pairing) -> Panel:
    message = messages[index]
    role = printable(str(message.get("role") or "?"))
    style = ROLE_STYLES.get(role, "white")
    parts: list[RenderableType] = []
    content = _content(message)
    if content:
        parts.append(Text(content))
    for entry in call_entries(message):
        if isinstance(entry, Mapping):
            parts.append(_call_card(entry, messages, positions, pairing))
    title = Text(role, style=f"bold {style}")
    if role == "tool":
        note = ("⚠ " + HEALED_NOTE if is_healed(message)
                else "↻ " + LATE_NOTE if _is_late(positions, index, message) else "")
        answered = result_id(message)
        parts.insert(0, Text(f"result for {printable(answered or '(no usable id)')}, "
                             "whose call is not in view" + (f"\n{note}" if note else ""),
                             style="dim italic"))
    return Panel(Group(*parts) if parts else Text("(empty)", style="dim"), title=title,
                 title_align="left", border_style=style)


def _summary(messages: Sequence[Mapping[str, Any]], positions: Sequence[int] | None) -> Text:
    calls = sum(len(call_entries(m)) for m in messages)
    healed = sum(1 for m in messages if m.get("role") == "tool" and is_healed(m))
    late = sum(1 for i, m in enumerate(messages)
               if m.get("role") == "tool" and _is_late(positions, i, m))
    text = Text(f"{_count(len(messages), 'message')} · {_count(calls, 'tool call')} · ",
                style="dim")
    text.append(_count(healed, "healed placeholder"), style="yellow" if healed else "dim")
    if positions is not None:
        text.append(" · ", style="dim")
        text.append(_count(late, "late result"), style="cyan" if late else "dim")
    return text


def render_transcript(messages: Sequence[Mapping[str, Any]],
                      positions: Sequence[int] | None = None) -> Group:
    """The transcript of ``messages`` (oldest first) as one ``rich`` renderable.

    ``positions`` (from :meth:`flowmem.Memory.history`) let late results
    (MEM-10) be marked; without them only healed
    placeholders (MEM-3) are. A tool result shown inside its call's card is
    not repeated on its own. Pure: nothing is printed.
    """
    if positions is not None and len(positions) != len(messages):
        raise ValueError("positions must have one entry per message")
    pairing = _pair(messages)
    panels: list[RenderableType] = [_summary(messages, positions)]
    panels += [_panel(messages, positions, i, pairing) for i in range(len(messages))
               if i not in pairing.shown]
    return Group(*panels)


def render_text(messages: Sequence[Mapping[str, Any]], positions: Sequence[int] | None = None,
                *, width: int = 100, color: bool = False) -> str:
    """:func:`render_transcript` as a string (ANSI colours when ``color``)."""
    sink = io.StringIO()
    console = Console(file=sink, width=width, force_terminal=color,
                      color_system="standard" if color else None, legacy_windows=False)
    console.print(render_transcript(messages, positions))
    return sink.getvalue()
