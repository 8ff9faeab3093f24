"""The transcript renderer (pure) and ``flowmem transcript``: roles, tool-call cards
paired by call id (MEM-11), healed placeholders (MEM-3) and late results (MEM-10) marked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flowmem
from buffer_model import messages as any_message
from flowmem import ExecutionContext, Memory
from flowmem.cli._main import main
from flowmem.render import HEALED_NOTE, LATE_NOTE, render_text, render_transcript

ALICE = ExecutionContext(user_id="alice")


def call(cid: str, name: str = "search", **arguments: Any) -> dict[str, Any]:
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


def story(memory: Memory) -> None:
    """c1 answered, c2 interrupted then answered late (MEM-10), c3 interrupted (MEM-3)."""
    memory.append("user", "chat", [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "Find cats and dogs"},
        {"role": "assistant", "content": "Searching", "tool_calls": [
            call("c1", q="cats"), call("c2", q="dogs")]},
        {"role": "tool", "tool_call_id": "c1", "content": "3 cats"}], context=ALICE)
    memory.append("user", "chat", {"role": "user", "content": "Well?"}, context=ALICE)
    memory.append("user", "chat", {"role": "tool", "tool_call_id": "c2", "content": "2 dogs"},
                  context=ALICE)
    memory.append("user", "chat", [
        {"role": "assistant", "content": None, "tool_calls": [call("c3", "weather")]},
        {"role": "user", "content": "next"}], context=ALICE)


@pytest.fixture
def page() -> flowmem.HistoryResult:
    with Memory.from_url("memory://") as memory:
        story(memory)
        return memory.history("user", "chat", context=ALICE)


def test_mem3_mem10_cards_pair_results_and_mark_healed_and_late(
        page: flowmem.HistoryResult) -> None:
    text = render_text(page.messages, page.positions, width=100)
    assert text.count("⚙ search") == 2 and text.count("⚙ weather") == 1
    assert text.count(HEALED_NOTE) == 1  # c3: interrupted, healed at "next" (MEM-3)
    assert text.count(LATE_NOTE) == 1    # c2: its late result replaced the placeholder
    assert text.index("3 cats") < text.index("2 dogs") < text.index("Well?")
    assert "whose call is not in view" not in text  # every result sits in its card
    assert '"q": "cats"' in text                      # arguments pretty-printed
    assert "9 messages · 3 tool calls · 1 healed placeholder · 1 late result" in text


def test_without_positions_late_results_cannot_be_told(page: flowmem.HistoryResult) -> None:
    text = render_text(page.messages, width=100)
    assert LATE_NOTE not in text and HEALED_NOTE in text and "late result" not in text


def test_orphans_and_provider_flat_shapes() -> None:
    flat = [{"role": "assistant", "content": "", "tool_calls": [
                {"tool_call_id": "k1", "name": "lookup", "arguments": {"id": 7}}]},
            {"role": "tool", "tool_call_id": "k1", "content": "found"},
            {"role": "tool", "tool_call_id": "zz", "content": "stray"},
            {"role": "tool", "tool_call_id": "k1", "content": "again"},
            {"role": "assistant", "tool_calls": [{"id": "k2", "function": {"name": "f"}}]}]
    text = render_text(flat, width=90)
    assert "⚙ lookup" in text and '"id": 7' in text and "found" in text
    assert text.count("whose call is not in view") == 2  # the orphan and the duplicate
    assert "no result yet" in text                       # k2, unanswered, not healed


def test_content_is_text_not_markup_and_colour_is_optional() -> None:
    messages = [{"role": "user", "content": "[bold red]not markup[/bold red]"}]
    plain = render_text(messages, width=60)
    assert "[bold red]not markup[/bold red]" in plain and "\x1b[" not in plain
    assert "\x1b[" in render_text(messages, width=60, color=True)


def test_positions_must_match_messages() -> None:
    with pytest.raises(ValueError, match="one entry per message"):
        render_transcript([{"role": "user", "content": "x"}], [0, 1])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(any_message, max_size=12), st.booleans())
def test_any_message_list_renders(messages: list[dict[str, Any]], stored: bool) -> None:
    if stored:
        result = flowmem.append([], messages)
        messages = result.messages
    render_text(messages, width=80)


# --------------------------------------------------------------------------- the CLI


def transcript(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(main, ["transcript", *args], env=env)


@pytest.fixture
def store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 't.db'}"
    with Memory.from_url(url) as memory:
        story(memory)
        memory.write("user", "prefs", {"lang": "fr"}, context=ALICE)
    return url


def test_cli_transcript_whole_and_last(store: str) -> None:
    done = transcript("--store", store, "--scope", "user", "--user", "alice", "--key", "chat",
                      "--no-color", "--width", "100", "--all")
    assert done.exit_code == 0, done.output
    assert LATE_NOTE in done.stdout and HEALED_NOTE in done.stdout and "\x1b[" not in done.stdout
    done = transcript("--store", store, "--scope", "user", "--user", "alice", "--key", "chat",
                      "--last", "2")
    assert done.exit_code == 0 and "older messages not shown" in done.stdout


def test_cli_transcript_bad_input_is_a_message(store: str) -> None:
    where = ["--store", store, "--scope", "user", "--key"]
    done = transcript(*where, "chat", "--user", "0")  # MEM-6
    assert done.exit_code == 3 and "refused" in done.stderr
    done = transcript(*where, "prefs", "--user", "alice")
    assert done.exit_code == 5 and "holds a plain value" in done.stderr  # a conflict
    done = transcript(*where, "chat", "--user", "alice", "--last", "0")
    assert done.exit_code == 2
    done = transcript("--store", "sqlite:///", "--scope", "global", "--key", "k")
    assert done.exit_code == 1 and "expected sqlite" in done.stderr
    done = transcript("--store", store, "--scope", "workflow", "--key", "k")
    assert done.exit_code == 0 and 'shared bucket ""' in done.stderr


@pytest.mark.processes
def test_cli_transcript_as_a_real_process_in_colour(store: str) -> None:
    command = [sys.executable, "-m", "flowmem.cli", "transcript", "--store", store,
               "--scope", "user", "--user", "alice", "--key", "chat"]
    coloured = subprocess.run([*command, "--color"], capture_output=True, text=True,
                              timeout=60, check=True)
    assert "\x1b[" in coloured.stdout and "weather" in coloured.stdout
    plain = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True,
                           env={**os.environ, "NO_COLOR": "1"})
    assert "\x1b[" not in plain.stdout and "Traceback" not in plain.stderr
