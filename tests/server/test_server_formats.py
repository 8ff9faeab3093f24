"""Provider dialects over HTTP (#11): ``format`` on the append and turn bodies (converted
at the door, so the rules apply by call id — MEM-1, MEM-3, MEM-10, MEM-11) and on the
history doors (``rendered``: the page as the provider takes it, sendable)."""

from __future__ import annotations

from typing import Any

import pytest

from flowmem import formats
from server_support import World, make_world


@pytest.fixture
def world() -> World:
    return make_world(seed=False)


def _append(world: World, body: dict[str, Any]) -> Any:
    return world.call("owner", "POST", "/v1/memory/append", {"scope": "user", "key": "c", **body})


def test_responses_items_in_heal_and_late_output_replaces(world: World) -> None:
    call = {"type": "function_call", "call_id": "f1", "name": "f", "arguments": "{}"}
    assert _append(world, {"format": "responses", "messages": [
        {"role": "user", "content": "hi"}, call]}).json()["data"]["count"] == 2
    healed = _append(world, {"messages": [{"role": "user", "content": "next"}]}).json()["data"]
    assert healed["count"] == 4  # MEM-3: a placeholder for f1
    late = _append(world, {"format": "responses", "messages": [
        {"type": "function_call_output", "call_id": "f1", "output": "late"}]}).json()["data"]
    assert (late["count"], late["appended"]) == (4, 0)  # MEM-10: replaced in place
    again = _append(world, {"format": "responses", "messages": [
        {"type": "function_call_output", "call_id": "f1", "output": "late"}]}).json()["data"]
    assert again["appended"] == 0  # MEM-1 across dialects


@pytest.mark.parametrize("dialect", ["openai", "responses", "anthropic"])
def test_history_renders_a_sendable_page(world: World, dialect: str) -> None:
    _append(world, {"messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "user", "content": "well?"}]})
    answer = world.call("owner", "POST", "/v1/memory/history",
                        {"scope": "user", "key": "c", "format": dialect})
    assert answer.status_code == 200
    rendered = answer.json()["data"]["rendered"]
    assert rendered["format"] == dialect
    assert formats.check(rendered["output"], dialect) == []


def test_turns_take_a_dialect_and_session_messages_render(world: World) -> None:
    sid = world.new_session("owner", "t")
    turn = {"format": "anthropic", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hello"}]}]}
    assert world.call("owner", "POST", f"/v1/sessions/{sid}/turns", turn).status_code == 200
    page = world.call("owner", "GET", f"/v1/sessions/{sid}/messages",
                      params={"format": "openai"}).json()["data"]
    assert page["rendered"]["output"][0]["role"] == "user"
    assert "rendered" not in world.call("owner", "GET", f"/v1/sessions/{sid}/messages").json()[
        "data"]


def test_a_dialect_mistaken_for_another_is_400_naming_the_converter(world: World) -> None:
    answer = _append(world, {"messages": [{"type": "function_call", "call_id": "x"}]})
    assert answer.status_code == 400
    assert answer.json()["error_code"] == "invalid_field"
    assert "Responses item" in str(answer.json())
    assert "format='responses'" in str(answer.json())


MALFORMED = [("responses", [{"type": []}], "responses[0].type"),
             ("openai", [{"role": {}, "content": "x"}], "openai[0].role"),
             ("responses", [{"role": {}, "content": "x"}], "responses[0].role")]


@pytest.mark.parametrize(("dialect", "messages", "locator"), MALFORMED)
def test_a_malformed_dialect_item_is_a_400_naming_it(world: World, dialect: str,
                                                     messages: list[Any], locator: str) -> None:
    sid = world.new_session("owner")
    for path, body in (("/v1/memory/append", {"scope": "user", "key": "c"}),
                       (f"/v1/sessions/{sid}/turns", {})):
        answer = world.call("owner", "POST", path,
                            {**body, "format": dialect, "messages": messages})
        assert answer.status_code == 400, answer.text
        refusal = answer.json()
        assert refusal["error_code"] == "invalid_message"
        assert refusal["details"][0]["locator"] == locator, refusal


def test_random_json_in_every_dialect_at_every_door_is_never_a_5xx() -> None:
    """The library's property (``tests/formats/test_formats_fuzz.py``) at the doors."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from json_fuzz import ITEM

    world = make_world(seed=False)
    sid = world.new_session("owner")
    doors = [("/v1/memory/append", {"scope": "user", "key": "c"}),
             (f"/v1/sessions/{sid}/turns", {})]

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(formats.FORMATS), st.lists(ITEM, min_size=1, max_size=4))
    def attack(dialect: str, messages: list[Any]) -> None:
        for path, body in doors:
            answer = world.call("owner", "POST", path,
                                {**body, "format": dialect, "messages": messages})
            assert answer.status_code < 500, (dialect, messages, answer.text)

    attack()
