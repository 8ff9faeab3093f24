"""``flowmem convert``, ``flowmem check``, ``history --format`` and ``append --format``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from flowmem import HEALED_CONTENT
from flowmem.cli._main import main
from formats_support import type_errors

pytestmark = pytest.mark.processes

TURNS = {"system": "be terse", "messages": [
    {"role": "user", "content": "go"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f",
                                       "input": {"a": 1}}]}]}


def run(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), input=stdin)
    return result.exit_code, result.stdout, result.stderr


def where(tmp_path: Path) -> list[str]:
    return ["--store", f"sqlite:///{tmp_path / 'cli.db'}", "--scope", "user", "--key", "c",
            "--user", "u"]


def test_append_in_a_dialect_and_read_history_in_another(tmp_path: Path) -> None:
    code, out, _ = run("append", *where(tmp_path), "--format", "anthropic", json.dumps(TURNS))
    assert code == 0 and json.loads(out)["appended"] == 3
    run("append", *where(tmp_path), '{"role": "user", "content": "next"}')  # heals t1 (MEM-3)
    for fmt in ("openai", "responses", "anthropic"):
        code, out, _ = run("history", *where(tmp_path), "--format", fmt)
        page = json.loads(out)
        assert code == 0 and page["format"] == fmt and page["dropped"] == 0
        payload: Any = page["messages"] if fmt != "anthropic" else {
            "system": page["system"], "messages": page["messages"]}
        assert type_errors(payload, fmt)[1] == 0
    assert HEALED_CONTENT in out


def test_history_pipes_into_normalize_and_convert(tmp_path: Path) -> None:
    """Real processes: ``flowmem history | flowmem normalize`` keeps every message."""
    run("append", *where(tmp_path), "--format", "anthropic", json.dumps(TURNS))
    command = [sys.executable, "-m", "flowmem.cli"]
    history = subprocess.run([*command, "history", *where(tmp_path)], capture_output=True,
                             text=True, check=True).stdout
    normalized = json.loads(subprocess.run([*command, "normalize"], input=history,
                                           capture_output=True, text=True, check=True).stdout)
    assert normalized["dropped"] == 0
    assert [m["role"] for m in normalized["messages"]] == ["system", "user", "assistant", "tool"]
    converted = subprocess.run([*command, "convert", "--from", "canonical", "--to", "openai"],
                               input=history, capture_output=True, text=True, check=True)
    assert json.loads(converted.stdout)[2]["tool_calls"][0]["id"] == "t1"


def test_convert_reads_jsonl_and_counts_what_the_target_cannot_carry(tmp_path: Path) -> None:
    items = [{"role": "user", "content": "2+2?"},
             {"type": "reasoning", "id": "rs_1", "summary": []},
             {"role": "assistant", "content": "4"}]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    code, out, err = run("convert", "--from", "responses", "--to", "anthropic", str(path))
    assert code == 0 and json.loads(out) == {"messages": [
        {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}
    assert err == "dropped 1 (responses items: 1)\n"
    code, out, _ = run("convert", "--from", "responses", "--to", "responses", str(path))
    assert [json.loads(line) for line in out.splitlines()] == items  # JSONL in, JSONL out


def test_check_lists_problems_and_fix_repairs_the_file(tmp_path: Path) -> None:
    path = tmp_path / "chat.json"
    path.write_text(json.dumps([
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                              "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "user", "content": "hello?"},
        {"role": "tool", "tool_call_id": "c1", "content": "late"}]))
    code, out, _ = run("check", str(path))
    assert code == 1 and out.splitlines() == [
        "1: MEM-5: call 'c1' has no result after it",
        "3: MEM-5: tool result 'c1' does not follow the assistant turn declaring it"]
    code, _, _ = run("check", "--fix", str(path))
    assert code == 0
    assert run("check", "--format", "openai", str(path))[0] == 0
    assert json.loads(path.read_text())[2] == {"role": "tool", "tool_call_id": "c1",
                                               "content": "late"}


def test_cli_errors_are_messages_not_tracebacks(tmp_path: Path) -> None:
    for args, stdin in ((["convert", "--from", "openai", "--to", "anthropic"], "not json{"),
                        (["convert", "--from", "openai", "--to", "anthropic"], '{"role": 1}'),
                        (["check", str(tmp_path / "missing.json")], None),
                        (["convert", "--from", "gemini", "--to", "openai"], "[]")):
        code, out, err = run(*args, stdin=stdin)
        assert code in (1, 2) and "Traceback" not in out + err and err.strip(), args
