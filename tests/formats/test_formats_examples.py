"""flowmem.formats on the cases of issue #11, one dialect feature at a time.

Every rendering here is also validated with the official SDK param types
(strict, unknown keys forbidden) and the provider's sequence checker.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import flowmem
from flowmem import HEALED_CONTENT, ExecutionContext, InvalidInput, InvalidMessage, Memory, formats
from formats_support import type_errors

IMAGE = "data:image/png;base64,iVBORw0KGgo="


def _use(call_id: str, name: str = "search", **args: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": args}


def _result(call_id: str, text: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call_id, "content": text}


def _sendable(history: list[dict[str, Any]]) -> dict[str, formats.Rendered]:
    """Render for every provider; assert each passes its types and sequence rules."""
    out = {}
    for name in ("openai", "responses", "anthropic"):
        rendered = formats.render(history, name)
        assert type_errors(rendered.output, name)[1] == 0, (name, rendered.output)
        assert formats.check(rendered.output, name) == [], (name, rendered.output)
        out[name] = rendered
    return out


# --------------------------------------------------------------------------- buffer rules

def test_anthropic_refired_tool_result_is_dropped_mem_1() -> None:
    turns = [{"role": "user", "content": "weather?"},
             {"role": "assistant", "content": [_use("toolu_1", city="Lisbon")]},
             {"role": "user", "content": [_result("toolu_1", "sunny")]}]
    stored = flowmem.append([], formats.from_anthropic(turns)).messages
    refired = formats.from_anthropic([{"role": "user", "content": [_result("toolu_1", "x")]}])
    result = flowmem.append(stored, refired)
    assert result.appended == 0
    assert [m["content"] for m in result.messages if m["role"] == "tool"] == ["sunny"]


def test_anthropic_interrupted_tool_use_is_healed_mem_3() -> None:
    turns = [{"role": "user", "content": "go"},
             {"role": "assistant", "content": [_use("toolu_1"), _use("toolu_2")]},
             {"role": "user", "content": [_result("toolu_1", "done"),
                                          {"type": "text", "text": "never mind"}]}]
    stored = flowmem.append([], formats.from_anthropic(turns)).messages
    assert [(m["role"], m["content"]) for m in stored[2:]] == [
        ("tool", "done"), ("tool", HEALED_CONTENT),
        ("user", [{"type": "text", "text": "never mind"}])]
    payload = _sendable(stored)["anthropic"].output
    assert payload["messages"][2]["content"][:2] == [
        _result("toolu_1", "done"), _result("toolu_2", HEALED_CONTENT)]


def test_late_function_call_output_replaces_its_placeholder_mem_10() -> None:
    items = [{"role": "user", "content": "go"},
             {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
             {"role": "user", "content": "still there?"}]
    stored = flowmem.append([], formats.from_responses(items)).messages
    assert stored[2]["content"] == HEALED_CONTENT
    late = formats.from_responses([{"type": "function_call_output", "call_id": "c1",
                                    "output": "42"}])
    stored = flowmem.append(stored, late).messages
    assert stored[2] == {"role": "tool", "content": "42", "metadata": {"tool_call_id": "c1"}}


def test_the_same_call_in_two_dialects_is_one_call_mem_11() -> None:
    chat = formats.from_openai_chat([{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}])
    stored = flowmem.append([{"role": "user", "content": "hi"}], chat).messages
    again = formats.from_anthropic([{"role": "assistant", "content": [_use("c1", "f")]}])
    assert flowmem.append(stored, again).appended == 0  # MEM-2 by call id


# --------------------------------------------------------------------------- extras kept

def test_chat_parts_name_refusal_and_developer_survive_a_round_trip() -> None:
    chat = [{"role": "developer", "content": "be brief"},
            {"role": "user", "name": "ana", "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": IMAGE, "detail": "low"}}]},
            {"role": "assistant", "content": None, "refusal": "I can't help with that."}]
    stored = formats.from_openai_chat(chat)
    assert stored[0] == {"role": "system", "content": "be brief",
                         "metadata": {"openai_role": "developer"}}
    rendered = _sendable(stored)
    assert rendered["openai"].output == chat and rendered["openai"].dropped == 0
    assert rendered["responses"].output[0] == {"role": "developer", "content": "be brief"}
    assert rendered["anthropic"].output["system"] == "be brief"
    image = rendered["anthropic"].output["messages"][0]["content"][1]
    assert image == {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                 "data": "iVBORw0KGgo="}}


def test_reasoning_items_pass_through_responses_and_are_counted_elsewhere() -> None:
    reasoning = {"type": "reasoning", "id": "rs_1", "encrypted_content": "gAAA",
                 "summary": [{"type": "summary_text", "text": "look it up"}]}
    items = [{"role": "user", "content": "2+2?"}, reasoning,
             {"type": "function_call", "call_id": "c1", "name": "calc",
              "arguments": '{"x": "2+2"}', "id": "fc_1", "status": "completed"},
             {"type": "function_call_output", "call_id": "c1", "output": "4"},
             {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
              "content": [{"type": "output_text", "text": "4", "annotations": []}]}]
    stored = formats.from_responses(items)
    assert len(stored) == 4 and stored[1]["metadata"]["responses"]["items"] == [reasoning]
    rendered = _sendable(stored)
    assert rendered["responses"].output == items and rendered["responses"].dropped == 0
    assert rendered["openai"].lost == {"responses item": 1, "responses call field": 2,
                                       "responses item field": 3}
    assert "responses items" in rendered["anthropic"].lost


def test_thinking_blocks_are_kept_only_for_anthropic() -> None:
    thinking = {"type": "thinking", "thinking": "hmm", "signature": "EqQBCkYIARgC"}
    turns = [{"role": "user", "content": "go"},
             {"role": "assistant", "content": [thinking, _use("toolu_1")]},
             {"role": "user", "content": [_result("toolu_1", "ok")]}]
    stored = formats.from_anthropic(turns)
    rendered = _sendable(stored)
    assert rendered["anthropic"].output == {"messages": turns}
    assert rendered["openai"].lost == {"thinking part": 1}
    assert rendered["responses"].lost == {"thinking part": 1}
    assert "hmm" not in json.dumps(rendered["openai"].output)  # never turned into text


def test_cache_control_and_is_error_are_kept_for_anthropic() -> None:
    turns = [{"role": "user", "content": [{"type": "text", "text": "hi",
                                           "cache_control": {"type": "ephemeral"}}]},
             {"role": "assistant", "content": [_use("toolu_1")]},
             {"role": "user", "content": [{**_result("toolu_1", "boom"), "is_error": True}]}]
    payload = {"system": [{"type": "text", "text": "rules",
                           "cache_control": {"type": "ephemeral"}}], "messages": turns}
    stored = formats.to_canonical(payload, "anthropic")
    rendered = _sendable(stored)
    assert rendered["anthropic"].output == payload
    assert rendered["openai"].lost == {"text.cache_control": 2, "anthropic field": 1}


# --------------------------------------------------------------------------- targets' rules

def test_chat_calls_get_id_type_and_json_string_arguments() -> None:
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": "", "metadata": {"tool_calls": [
                   {"tool_call_id": "c1", "function": {"name": "f", "arguments": {"a": 1}}}]}},
               {"role": "tool", "content": None, "metadata": {"tool_call_id": "c1"}}]
    out = _sendable(history)["openai"].output
    assert out[1]["tool_calls"] == [{"id": "c1", "type": "function",
                                     "function": {"name": "f", "arguments": '{"a": 1}'}}]
    assert out[2] == {"role": "tool", "tool_call_id": "c1", "content": ""}


def test_anthropic_lifts_system_merges_turns_and_starts_with_a_user_turn() -> None:
    history = [{"role": "assistant", "content": "hello!"},
               {"role": "system", "content": "be kind"},
               {"role": "user", "content": "a"}, {"role": "user", "content": ""},
               {"role": "user", "content": "b"},
               {"role": "assistant", "content": "c"}, {"role": "assistant", "content": "d"}]
    rendered = _sendable(history)["anthropic"]
    assert rendered.output == {"system": "be kind", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"},
                                     {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "c"},
                                          {"type": "text", "text": "d"}]}]}
    assert rendered.lost == {"turn before the first user turn": 1, "empty user turn": 1}


def test_mem_5_repairs_run_before_every_target() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    history = [{"role": "tool", "content": "orphan", "tool_call_id": "zz"},
               {"role": "user", "content": "hi"},
               {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "user", "content": "next"},
               {"role": "tool", "content": "late", "tool_call_id": "c1"},
               {"role": "tool", "content": "dup", "tool_call_id": "c1"}]
    for rendered in _sendable(history).values():
        assert rendered.dropped == 2  # the orphan and the duplicate
    out = formats.to_openai_chat(history)
    assert [m.get("content") for m in out] == ["hi", None, "late", "next"]


def test_checkers_report_index_rule_and_problem() -> None:
    assert [str(p) for p in formats.check_anthropic({"messages": [
        {"role": "assistant", "content": "x"}, {"role": "assistant", "content": "y"}]})] == [
        "0: anthropic.first: the first turn must be user",
        "1: anthropic.alternation: two assistant turns in a row"]
    assert [p.rule for p in formats.check_openai_chat([
        {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f"}}]}])] == [
        "openai.tool_calls", "MEM-5"]
    assert [p.index for p in formats.check_responses([
        {"type": "function_call_output", "call_id": "x", "output": ""}])] == [0]


# --------------------------------------------------------------------------- errors, Memory

@pytest.mark.parametrize(("message", "converter"), [
    ({"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
     "from_responses"),
    ({"type": "reasoning", "id": "rs", "summary": []}, "from_responses"),
    ({"role": "user", "content": [_result("t", "x")]}, "from_anthropic"),
    ({"role": "assistant", "content": [_use("t")]}, "from_anthropic"),
    ({"role": "developer", "content": "x"}, "from_openai_chat"),
])
def test_append_names_the_dialect_and_its_converter(message: dict[str, Any],
                                                    converter: str) -> None:
    with pytest.raises(InvalidMessage, match=converter):
        flowmem.append([], [message])


def test_unknown_format_is_invalid_input() -> None:
    with pytest.raises(InvalidInput, match="format must be one of"):
        formats.render([], "gemini")


def test_memory_history_renders_for_a_provider(tmp_path: Path) -> None:
    context = ExecutionContext(user_id="u1")
    with Memory.from_url(f"sqlite:///{tmp_path / 'm.db'}") as memory:
        incoming = formats.to_canonical({"system": "terse", "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [_use("toolu_1")]}]}, "anthropic")
        memory.append("user", "chat", incoming, context=context)
        memory.append("user", "chat", formats.from_anthropic(
            [{"role": "user", "content": [_result("toolu_1", "ok"), _result("toolu_1", "ok")]}]),
            context=context)
        page = memory.history("user", "chat", context=context)
    assert _sendable(page.messages)["openai"].output == [
        {"role": "system", "content": "terse"}, {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "search", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "ok"}]


def test_a_turn_left_empty_by_the_repair_is_dropped_for_every_target() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "content": "r", "tool_call_id": "c1"},
               {"role": "assistant", "content": "", "tool_calls": [call]}]  # MEM-5: twice
    for rendered in _sendable(history).values():
        assert rendered.dropped == 2  # the repeated declaration and the emptied turn


def test_the_validators_bite() -> None:
    """The SDK type check and the checkers refuse what a provider refuses."""
    untyped_call = [{"role": "assistant", "content": None,
                     "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}]}]
    assert type_errors(untyped_call, "openai") == (1, 1)
    assert type_errors({"messages": [{"role": "user", "content": "x", "name": "ana"}]},
                       "anthropic") == (1, 1)
    assert type_errors([{"type": "function_call", "call_id": "c", "name": "f",
                         "arguments": {}}], "responses") == (1, 1)
    payload = formats.to_anthropic(formats.from_anthropic([
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [_use("toolu_1")]},
        {"role": "user", "content": [_result("toolu_1", "ok")]}]))
    del payload["messages"][2]
    assert [p.rule for p in formats.check_anthropic(payload)] == ["MEM-5"]
