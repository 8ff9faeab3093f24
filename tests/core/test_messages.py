"""Messages: the canonical stored shape and strict, all-or-nothing validation."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest

from flowmem import (
    HEALED_CONTENT,
    ROLES,
    ConversationBuffer,
    FlowmemError,
    InvalidInput,
    InvalidMessage,
    MessageTypeError,
    append,
    canonical_message,
    healed_placeholder,
)
from flowmem.errors import InvalidValue
from flowmem.messages import MAX_JSON_DEPTH, canonical_messages, json_copy

Msg = dict[str, Any]

OPENAI_CALL: Msg = {"id": "call_1", "type": "function",
                    "function": {"name": "search", "arguments": "{\"q\": \"cats\"}"}}


def nested(depth: int, leaf: Any = "x") -> Any:
    """``depth`` lists nested in one another around ``leaf`` (built without recursion)."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


# --------------------------------------------------------------------------- canonical shape


def test_roles() -> None:
    assert frozenset({"system", "user", "assistant", "tool"}) == ROLES


def test_openai_assistant_turn_keeps_tool_calls_intact_in_metadata() -> None:
    flat = {"role": "assistant", "content": None, "tool_calls": [copy.deepcopy(OPENAI_CALL)]}
    assert canonical_message(flat) == {"role": "assistant", "content": None,
                                       "metadata": {"tool_calls": [OPENAI_CALL]}}


def test_openai_tool_result_moves_tool_call_id_into_metadata() -> None:
    flat = {"role": "tool", "content": "Found 3 cats", "tool_call_id": "call_1"}
    assert canonical_message(flat) == {"role": "tool", "content": "Found 3 cats",
                                       "metadata": {"tool_call_id": "call_1"}}


def test_content_none_is_kept() -> None:
    assert canonical_message({"role": "assistant", "content": None})["content"] is None
    assert canonical_message({"role": "user"}) == {"role": "user", "content": None,
                                                   "metadata": {}}


def test_other_provider_fields_go_into_metadata_and_none_fields_are_skipped() -> None:
    flat = {"role": "user", "content": "hi", "name": "alice", "refusal": None,
            "metadata": {"source": "web"}}
    assert canonical_message(flat) == {"role": "user", "content": "hi",
                                       "metadata": {"source": "web", "name": "alice"}}


def test_top_level_pairing_fields_win_over_metadata() -> None:
    flat = {"role": "tool", "content": "r", "tool_call_id": "top",
            "metadata": {"tool_call_id": "meta"}}
    assert canonical_message(flat)["metadata"] == {"tool_call_id": "top"}


def test_canonical_message_is_unchanged_and_copied() -> None:
    message = {"role": "assistant", "content": [{"type": "text", "text": "hi"}],
               "metadata": {"tool_calls": [{"tool_call_id": "c1"}], "x": {"y": [1, 2]}}}
    before = copy.deepcopy(message)
    stored = canonical_message(message)
    assert stored == message == before
    stored["metadata"]["x"]["y"].append(3)
    stored["content"][0]["text"] = "changed"
    assert message == before  # a deep copy, not a view


def test_usable_result_id_is_stored_trimmed_and_as_a_string() -> None:
    assert canonical_message({"role": "tool", "tool_call_id": 7})["metadata"] == {
        "tool_call_id": "7"}
    assert canonical_message({"role": "tool", "tool_call_id": " c1 "})["metadata"] == {
        "tool_call_id": "c1"}
    # unusable ids are kept as given (MEM-1: appended as it is)
    assert canonical_message({"role": "tool", "tool_call_id": "0"})["metadata"] == {
        "tool_call_id": "0"}


def test_tuples_become_lists() -> None:
    stored = canonical_message({"role": "assistant", "content": ("a", "b"),
                                "tool_calls": ({"id": "c1"},)})
    assert stored == {"role": "assistant", "content": ["a", "b"],
                      "metadata": {"tool_calls": [{"id": "c1"}]}}


@pytest.mark.parametrize("content", [
    [{"type": "text", "text": "what is in this image?"},
     {"type": "image_url", "image_url": {"url": "https://example.com/cat.png", "detail": "low"}}],
    {"type": "json", "data": {"a": [1, 2.5, None, True]}},
    42, 2.5, True, False, "", "  ",
], ids=repr)
def test_structured_and_scalar_content_is_stored_as_given(content: Any) -> None:
    message = {"role": "user", "content": copy.deepcopy(content)}
    result = append([], message)
    assert result.messages == [{"role": "user", "content": content, "metadata": {}}]
    assert type(result.messages[0]["content"]) is type(content)


def test_append_stores_openai_flat_messages_in_canonical_shape() -> None:
    flat = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "find cats"},
        {"role": "assistant", "content": None, "tool_calls": [copy.deepcopy(OPENAI_CALL)]},
        {"role": "tool", "content": "Found 3 cats", "tool_call_id": "call_1"},
    ]
    result = append([], flat)
    assert result.messages == [
        {"role": "system", "content": "be brief", "metadata": {}},
        {"role": "user", "content": "find cats", "metadata": {}},
        {"role": "assistant", "content": None, "metadata": {"tool_calls": [OPENAI_CALL]}},
        {"role": "tool", "content": "Found 3 cats", "metadata": {"tool_call_id": "call_1"}},
    ]
    assert result.appended == 4


def test_flat_buffer_passed_to_append_is_canonicalized() -> None:
    buffer = [{"role": "assistant", "content": None, "tool_calls": [OPENAI_CALL]},
              {"role": "tool", "content": "r", "tool_call_id": "call_1"}]
    result = append(buffer, {"role": "user", "content": "next"})
    assert result.messages[0] == {"role": "assistant", "content": None,
                                  "metadata": {"tool_calls": [OPENAI_CALL]}}
    assert result.messages[1] == {"role": "tool", "content": "r",
                                  "metadata": {"tool_call_id": "call_1"}}


def test_single_message_or_list() -> None:
    assert canonical_messages({"role": "user", "content": "a"}) == [
        {"role": "user", "content": "a", "metadata": {}}]
    assert canonical_messages(({"role": "user", "content": "a"},)) == [
        {"role": "user", "content": "a", "metadata": {}}]
    assert canonical_messages([]) == []


# --------------------------------------------------------------------------- strict errors

GOOD: list[Msg] = [{"role": "user", "content": "fine"}, {"role": "assistant", "content": "ok"}]

BAD_CASES: list[tuple[str, Any, type[InvalidMessage], str]] = [
    # (id, bad message at index 2, error class, location the message must name)
    ("string", "hello", MessageTypeError, "incoming[2]:"),
    ("int", 5, MessageTypeError, "incoming[2]:"),
    ("none", None, MessageTypeError, "incoming[2]:"),
    ("list", ["role", "user"], MessageTypeError, "incoming[2]:"),
    ("missing-role", {"content": "x"}, InvalidMessage, "incoming[2].role"),
    ("unknown-role", {"role": "bot", "content": "x"}, InvalidMessage, "incoming[2].role"),
    ("upper-role", {"role": "User", "content": "x"}, InvalidMessage, "incoming[2].role"),
    ("none-role", {"role": None, "content": "x"}, InvalidMessage, "incoming[2].role"),
    ("int-role", {"role": 1, "content": "x"}, InvalidMessage, "incoming[2].role"),
    ("set-content", {"role": "user", "content": {"a", "b"}}, MessageTypeError,
     "incoming[2].content"),
    ("bytes-content", {"role": "user", "content": b"raw"}, MessageTypeError,
     "incoming[2].content"),
    ("object-content", {"role": "user", "content": object()}, MessageTypeError,
     "incoming[2].content"),
    ("nan-content", {"role": "user", "content": math.nan}, InvalidMessage,
     "incoming[2].content"),
    ("inf-content", {"role": "user", "content": -math.inf}, InvalidMessage,
     "incoming[2].content"),
    ("nested-set-content", {"role": "user", "content": {"a": {"b": {1}}}}, MessageTypeError,
     "incoming[2].content.a.b"),
    ("int-key-content", {"role": "user", "content": {1: "x"}}, MessageTypeError,
     "incoming[2].content"),
    ("metadata-string", {"role": "user", "content": "x", "metadata": "meta"}, MessageTypeError,
     "incoming[2].metadata"),
    ("metadata-list", {"role": "user", "content": "x", "metadata": [("a", 1)]},
     MessageTypeError, "incoming[2].metadata"),
    ("metadata-bytes-value", {"role": "user", "content": "x", "metadata": {"k": b"v"}},
     MessageTypeError, "incoming[2].metadata.k"),
    ("tool-calls-string", {"role": "assistant", "content": "", "tool_calls": "c1"},
     MessageTypeError, "incoming[2].tool_calls"),
    ("tool-calls-mapping", {"role": "assistant", "content": "", "tool_calls": {"id": "c1"}},
     MessageTypeError, "incoming[2].tool_calls"),
    ("metadata-tool-calls-string",
     {"role": "assistant", "content": "", "metadata": {"tool_calls": "c1"}},
     MessageTypeError, "incoming[2].tool_calls"),
    ("tool-call-entry-string", {"role": "assistant", "content": "", "tool_calls": ["c1"]},
     MessageTypeError, "incoming[2].tool_calls[0]"),
    ("extra-field-set", {"role": "user", "content": "x", "name": {"a"}}, MessageTypeError,
     "incoming[2].name"),
    ("too-deep", {"role": "user", "content": nested(MAX_JSON_DEPTH + 1)}, InvalidMessage,
     "incoming[2].content"),
]


@pytest.mark.parametrize(("bad", "error", "location"), [c[1:] for c in BAD_CASES],
                         ids=[c[0] for c in BAD_CASES])
def test_invalid_message_raises_a_typed_error_naming_index_and_field(
        bad: Any, error: type[InvalidMessage], location: str) -> None:
    with pytest.raises(error) as caught:
        canonical_messages([*GOOD, bad])
    exc = caught.value
    assert type(exc) is error
    assert str(exc).startswith(location), str(exc)
    assert exc.index == 2
    assert isinstance(exc, InvalidInput)
    assert isinstance(exc, ValueError)
    assert isinstance(exc, FlowmemError)
    if error is MessageTypeError:
        assert isinstance(exc, TypeError)


@pytest.mark.parametrize(("bad", "error", "location"), [c[1:] for c in BAD_CASES],
                         ids=[c[0] for c in BAD_CASES])
def test_invalid_message_appends_nothing_pure(
        bad: Any, error: type[InvalidMessage], location: str) -> None:
    buffer = [{"role": "user", "content": "before", "metadata": {}},
              {"role": "assistant", "content": "", "metadata": {"tool_calls": [{"id": "c1"}]}}]
    snapshot = copy.deepcopy(buffer)
    with pytest.raises(error) as caught:
        append(buffer, [*GOOD, bad])
    assert str(caught.value).startswith(location)
    assert buffer == snapshot


@pytest.mark.parametrize(("bad", "error", "location"), [c[1:] for c in BAD_CASES],
                         ids=[c[0] for c in BAD_CASES])
def test_invalid_message_appends_nothing_stateful(
        bad: Any, error: type[InvalidMessage], location: str) -> None:
    buf = ConversationBuffer([{"role": "user", "content": "before"},
                              {"role": "assistant", "content": "",
                               "tool_calls": [{"id": "c1"}]}], max_messages=3)
    snapshot = buf.messages
    # the good messages come first, and a user message would have healed c1
    with pytest.raises(error):
        buf.append([*GOOD, bad])
    assert len(buf) == 2
    assert buf.messages == snapshot
    # the buffer still works, and its indexes were not touched
    result = buf.append({"role": "tool", "content": "r", "tool_call_id": "c1"})
    assert result.to_dict() == {"count": 3, "appended": 1, "appended_any": True}


def test_single_invalid_message_names_no_index() -> None:
    with pytest.raises(InvalidMessage) as caught:
        append([], {"role": "bot"})
    assert str(caught.value).startswith("incoming.role:")
    assert caught.value.index is None
    assert caught.value.field == "role"


@pytest.mark.parametrize("incoming", ["hello", 5, None, {"user", "x"},
                                      (m for m in GOOD)],
                         ids=["str", "int", "None", "set", "generator"])
def test_incoming_that_is_neither_message_nor_list_is_a_type_error(incoming: Any) -> None:
    with pytest.raises(MessageTypeError) as caught:
        append([], incoming)
    assert isinstance(caught.value, TypeError)
    assert str(caught.value).startswith("incoming:")


def test_invalid_stored_buffer_is_named_messages() -> None:
    with pytest.raises(InvalidMessage) as caught:
        append([{"role": "user", "content": "ok"}, {"role": "robot"}],
               {"role": "user", "content": "x"})
    assert str(caught.value).startswith("messages[1].role")
    with pytest.raises(MessageTypeError) as caught_type:
        ConversationBuffer([{"role": "user", "content": {1, 2}}])
    assert str(caught_type.value).startswith("messages[0].content")


def test_invalid_item_inside_a_list_is_named_with_its_index() -> None:
    with pytest.raises(MessageTypeError) as caught:
        append([], [{"role": "user", "content": ["ok", {1}]}])
    assert str(caught.value).startswith("incoming[0].content[1]:"), str(caught.value)


# --------------------------------------------------------------------------- strings and depth


@pytest.mark.parametrize("text", ["\ud800", "a\udfffb", "\x00", "nul\x00in\x00side",
                                  "\ud83d\ude00", "😀 é ß", "\ufeff", ""], ids=repr)
def test_lone_surrogates_and_nul_are_accepted_and_preserved(text: str) -> None:
    message = {"role": "tool", "content": text, "tool_call_id": f"id{text}x",
               "metadata": {f"key{text}": [text, {"nested": text}]}}
    result = append([{"role": "assistant", "content": text,
                      "tool_calls": [{"id": f"id{text}x"}]}], message)
    stored = result.messages[1]
    assert stored["content"] == text
    assert stored["metadata"][f"key{text}"] == [text, {"nested": text}]
    assert stored["metadata"]["tool_call_id"] == f"id{text}x"
    buf = ConversationBuffer()
    buf.append([{"role": "user", "content": text}])
    assert buf.messages[0]["content"] == text


def test_nesting_at_max_json_depth_is_accepted() -> None:
    content = nested(MAX_JSON_DEPTH)
    result = append([], {"role": "user", "content": content})
    assert result.messages[0]["content"] == content
    deep_meta = nested(MAX_JSON_DEPTH - 1)
    result = append([], {"role": "user", "content": "x", "metadata": {"deep": deep_meta}})
    assert result.messages[0]["metadata"]["deep"] == deep_meta


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, MAX_JSON_DEPTH + 2, 10_000])
def test_nesting_deeper_than_max_json_depth_is_refused(depth: int) -> None:
    buf = ConversationBuffer([{"role": "user", "content": "before"}])
    for message in ({"role": "user", "content": nested(depth)},
                    {"role": "user", "content": "x", "metadata": {"deep": nested(depth)}},
                    {"role": "user", "content": "x", "extra": nested(depth)}):
        with pytest.raises(InvalidMessage) as caught:
            buf.append([{"role": "user", "content": "fine"}, message])
        assert not isinstance(caught.value, TypeError)
        assert str(caught.value).startswith("incoming[1].")
        assert "deeper" in str(caught.value)
    assert len(buf) == 1


def test_deep_mappings_are_refused_too() -> None:
    value: Any = "leaf"
    for _ in range(MAX_JSON_DEPTH + 1):
        value = {"k": value}
    with pytest.raises(InvalidMessage):
        append([], {"role": "user", "content": value})


# --------------------------------------------------------------------------- helpers


def test_healed_placeholder_is_canonical() -> None:
    placeholder = healed_placeholder("c1")
    assert placeholder == {"role": "tool", "content": HEALED_CONTENT,
                           "metadata": {"tool_call_id": "c1", "healed": True}}
    assert canonical_message(placeholder) == placeholder


def test_json_copy_refuses_non_json_with_invalid_value() -> None:
    assert json_copy({"a": (1, 2), "b": [None, "x"]}) == {"a": [1, 2], "b": [None, "x"]}
    for bad in ({1, 2}, {"a": math.nan}, {"a": b"x"}, {1: "a"}, nested(MAX_JSON_DEPTH + 1)):
        with pytest.raises(InvalidValue) as caught:
            json_copy(bad)
        assert isinstance(caught.value, ValueError)
        assert isinstance(caught.value, FlowmemError)
