"""The memory commands of the ``flowmem`` CLI: thin layers over ``Memory``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from flowmem import HEALED_CONTENT
from flowmem.cli._main import main


def run(*args: str, stdin: str | None = None) -> tuple[int, Any]:
    result = CliRunner().invoke(main, list(args), input=stdin)
    output = json.loads(result.stdout) if result.stdout.strip().startswith("{") else result.output
    return result.exit_code, output


def test_mem3_mem10_mem14_append_and_history_through_the_cli(tmp_path: Path) -> None:
    where = ["--store", f"sqlite:///{tmp_path / 'cli.db'}", "--scope", "user", "--key", "chat",
             "--user", "alice"]
    turn = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]}]
    assert run("append", *where, json.dumps(turn))[1]["appended"] == 2
    code, healed = run("append", *where, stdin='{"role": "user", "content": "next"}')
    assert code == 0 and healed == {"scope": "user", "resolved_scope_id": "alice",  # MEM-3
                                    "refused": False, "replayed": False, "count": 4,
                                    "appended": 1,
                                    "appended_any": True, "replaced": 0,
                                    "dropped_results": 0, "dropped_turns": 0, "healed": 1}
    late = run("append", *where, '{"role": "tool", "tool_call_id": "c1", "content": "r"}')[1]
    assert late["count"] == 4 and late["appended"] == 0  # MEM-10
    assert late["replaced"] == 1 and late["dropped_results"] == 0
    code, page = run("history", *where, "--last", "2")
    assert code == 0
    assert [m["message"]["content"] for m in page["messages"]] == ["r", "next"]
    assert HEALED_CONTENT not in json.dumps(page)


def test_mem6_mem7_refusal_exits_3_with_the_neutral_result(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'cli.db'}"
    code, result = run("write", "--store", store, "--scope", "user", "--key", "k",
                       "--user", "0", '"v"')
    assert code == 3
    assert result == {"ok": False, "scope": "user", "resolved_scope_id": "", "refused": True,
                      "replayed": False}
    code, read = run("read", "--store", store, "--scope", "user", "--key", "k", "--user", "0")
    assert code == 3 and read["found"] is False


def test_values_round_trip_and_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    where = ["--store", f"sqlite:///{tmp_path / 'cli.db'}", "--scope", "workflow",
             "--key", "k", "--workflow", "wf"]
    assert run("write", *where, '{"a": [1, "\\u0000"]}')[0] == 0
    assert run("read", *where)[1]["value"] == {"a": [1, "\x00"]}
    code, output = run("append", *where, '{"role": "robot"}')
    assert code == 1 and "role" in str(output)
    assert run("delete", *where)[1]["found"] is True
    code, output = run("write", *where, "not json")
    assert code == 2 and "not JSON" in str(output)


def test_mem5_normalize_reads_stdin() -> None:
    code, result = run("normalize", stdin='[{"role": "tool", "tool_call_id": "x"}, '
                                          '{"role": "user", "content": "u"}]')
    assert code == 0 and result == {"messages": [{"role": "user", "content": "u"}], "dropped": 1}


def test_history_max_tokens_keeps_whole_turns_within_the_budget(tmp_path: Path) -> None:
    """--max-tokens: the newest whole turns that fit, their count and what was left out;
    a turn and its tool results stay together (MEM-5 sendable in every dialect)."""
    store = f"sqlite:///{tmp_path / 'budget.db'}"
    where = ["--store", store, "--scope", "user", "--key", "chat", "--user", "alice"]
    turn = [{"role": "user", "content": "weather in Paris, please, and some more words"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "w", "type": "function",
                 "function": {"name": "weather", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "w", "content": "18 degrees and sunny today"},
            {"role": "user", "content": "and tomorrow, with a few more words to count?"}]
    assert run("append", *where, json.dumps(turn))[0] == 0
    code, whole = run("history", *where, "--max-tokens", "100000")
    assert code == 0 and whole["omitted"] == 0 and len(whole["messages"]) == 4
    code, newest = run("history", *where, "--max-tokens", str(whole["tokens"] - 1))
    assert code == 0 and newest["tokens"] < whole["tokens"]
    assert [m["message"]["role"] for m in newest["messages"]] == ["user"]
    assert newest["omitted"] == 3
    code, openai = run("history", *where, "--max-tokens", "100000", "--format", "openai")
    assert code == 0 and [m["role"] for m in openai["messages"]] == [
        "user", "assistant", "tool", "user"]
    assert run("history", *where, "--max-tokens", "0")[0] == 2  # a usage error
