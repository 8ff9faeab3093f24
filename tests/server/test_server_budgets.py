"""Token budgets at the HTTP history doors: ``max_tokens`` (``counter``, ``keep_system``,
the dialect ``format``) on ``POST /v1/memory/history`` and ``GET /v1/sessions/{id}/messages``.

The answer keeps the page's shape with ``tokens`` and ``omitted``, no ``before``
cursor, and ``pagination`` whose ``has_more`` says something was left out; it is
what the library's budgeted read answers; bad values are 400, never 5xx.
"""

from __future__ import annotations

from typing import Any

import pytest

from flowmem import Memory, formats, is_sendable
from flowmem.context import approximate, tiktoken_unavailable
from flowmem.context._budget import countable, render_for
from server_support import World, make_world

CALL = {"id": "c{}", "type": "function", "function": {"name": "search", "arguments": "{}"}}


def _turn(i: int) -> list[dict[str, Any]]:
    call = {**CALL, "id": f"c{i}"}
    return [{"role": "user", "content": f"question {i}: where are the cats?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": "3 cats on the mat " * 3},
            {"role": "assistant", "content": f"There are 3 cats ({i})."}]


CONVERSATION = [{"role": "system", "content": "Be brief."},
                *[m for i in range(12) for m in _turn(i)],
                {"role": "user", "content": "and dogs?"},
                {"role": "assistant", "content": None, "tool_calls": [{**CALL, "id": "w"}]}]


@pytest.fixture
def world() -> World:
    world = make_world(seed=False)
    answer = world.call("owner", "POST", "/v1/memory/append",
                        {"scope": "user", "key": "c", "messages": CONVERSATION})
    assert answer.status_code == 200, answer.text
    return world


def _history(world: World, **fields: Any) -> Any:
    return world.call("owner", "POST", "/v1/memory/history",
                      {"scope": "user", "key": "c", **fields})


def _library(budget: int, dialect: str = "canonical", keep_system: bool = True) -> Any:
    memory = Memory.from_url("memory://")
    memory.append("global", "c", CONVERSATION, context=None)
    return memory.history("global", "c", context=None, max_tokens=budget, format=dialect,
                          keep_system=keep_system)


@pytest.mark.parametrize("dialect", ["canonical", "openai", "responses", "anthropic"])
def test_a_budgeted_history_is_the_library_s_answer_in_a_page_s_shape(
        world: World, dialect: str) -> None:
    answer = _history(world, max_tokens=200, format=dialect)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    data, expected = body["data"], _library(200, dialect)
    assert [p["message"] for p in data["messages"]] == expected.messages
    assert [p["position"] for p in data["messages"]] == expected.positions
    assert data["messages"][-1]["position"] == -1  # the waiting call's placeholder
    assert data["tokens"] == expected.tokens <= 200
    kept = sum(1 for p in data["messages"] if p["position"] >= 0)
    assert data["omitted"] == len(CONVERSATION) - kept > 0
    assert data["before"] is None  # one decision, not a page: no cursor continues it
    assert body["pagination"] == {"total": len(CONVERSATION), "limit": kept, "offset": 0,
                                  "has_more": True}
    messages = [p["message"] for p in data["messages"]]
    assert is_sendable(messages) and messages[0]["role"] == "system"
    if dialect != "canonical":
        output = data["rendered"]["output"]
        assert formats.check(output, dialect) == []
        assert approximate(countable(output, dialect)) == data["tokens"]
    else:
        assert approximate(countable(render_for(messages, "canonical"), "canonical")) \
            == data["tokens"]


def test_keep_system_and_a_budget_that_holds_everything(world: World) -> None:
    data = _history(world, max_tokens=200, keep_system=False).json()["data"]
    assert data["messages"][0]["message"]["role"] == "user"
    whole = _history(world, max_tokens=100_000).json()
    assert whole["data"]["omitted"] == 0 and whole["pagination"]["has_more"] is False
    assert len(whole["data"]["messages"]) == len(CONVERSATION) + 1  # and the placeholder
    assert _history(world, max_tokens=0).json()["data"] == {
        "scope": "user", "resolved_scope_id": "alice", "refused": False, "messages": [],
        "before": None, "tokens": 0, "omitted": len(CONVERSATION)}


def test_the_session_door_takes_the_budget_as_query_parameters(world: World) -> None:
    sid = world.new_session("owner", "budget")
    assert world.call("owner", "POST", f"/v1/sessions/{sid}/viewers",
                      {"user_id": "bob"}).status_code == 200
    assert world.call("owner", "POST", f"/v1/sessions/{sid}/turns",
                      {"messages": CONVERSATION}).status_code == 200
    for role in ("owner", "viewer"):  # a read: viewers too (MEM-9)
        answer = world.call(role, "GET", f"/v1/sessions/{sid}/messages",
                            params={"max_tokens": 150, "format": "anthropic",
                                    "keep_system": "false"})
        assert answer.status_code == 200, answer.text
        data, expected = answer.json()["data"], _library(150, "anthropic", keep_system=False)
        assert [p["message"] for p in data["messages"]] == expected.messages
        assert (data["tokens"], data["before"]) == (expected.tokens, None)
        assert formats.check(data["rendered"]["output"], "anthropic") == []
    assert world.call("other", "GET", f"/v1/sessions/{sid}/messages",
                      params={"max_tokens": 150}).status_code == 404


def test_a_refused_scope_is_the_neutral_result() -> None:
    world = make_world(seed=False)
    answer = world.call("owner", "POST", "/v1/memory/history",
                        {"scope": "session", "key": "c", "max_tokens": 100})
    assert answer.status_code == 200
    assert answer.json()["data"] == {"scope": "session", "resolved_scope_id": "",
                                     "refused": True, "messages": [], "before": None,
                                     "tokens": 0, "omitted": 0}


BAD_BODIES = [
    ({"max_tokens": -1}, "body.max_tokens"),
    ({"max_tokens": "100"}, "body.max_tokens"),
    ({"max_tokens": True}, "body.max_tokens"),
    ({"max_tokens": 1.5}, "body.max_tokens"),
    ({"max_tokens": 10**12}, "body.max_tokens"),
    ({"max_tokens": 100, "limit": 5}, "body.limit"),
    ({"max_tokens": 100, "last": 5}, "body.last"),
    ({"max_tokens": 100, "offset": 1}, "body.offset"),
    ({"max_tokens": 100, "before": 3}, "body.before"),
    ({"max_tokens": 100, "counter": "gpt2"}, "body.counter"),
    ({"max_tokens": 100, "keep_system": "no"}, "body.keep_system"),
    ({"counter": "approximate"}, "body.counter"),
    ({"keep_system": False}, "body.keep_system"),
]


@pytest.mark.parametrize(("fields", "locator"), BAD_BODIES)
def test_bad_budget_fields_are_400_naming_the_field(world: World, fields: dict[str, Any],
                                                    locator: str) -> None:
    answer = _history(world, **fields)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error_code"] == "invalid_field"
    assert locator in [d["locator"] for d in answer.json()["details"]]


@pytest.mark.parametrize(("params", "locator"), [
    ({"max_tokens": -1}, "query.max_tokens"), ({"max_tokens": "many"}, "query.max_tokens"),
    ({"max_tokens": 10**12}, "query.max_tokens"), ({"max_tokens": 9, "limit": 5}, "query.limit"),
    ({"max_tokens": 9, "before": 5}, "query.before"), ({"max_tokens": 9, "counter": "x"},
                                                       "query.counter"),
    ({"keep_system": "true"}, "query.keep_system")])
def test_bad_budget_query_parameters_are_400(world: World, params: dict[str, Any],
                                             locator: str) -> None:
    sid = world.new_session("owner", "q")
    answer = world.call("owner", "GET", f"/v1/sessions/{sid}/messages", params=params)
    assert answer.status_code == 400, answer.text
    assert locator in [d["locator"] for d in answer.json()["details"]]


def test_an_encoding_not_cached_here_is_400_with_its_reason(world: World) -> None:
    reason = tiktoken_unavailable("r50k_base")
    answer = _history(world, max_tokens=100, counter="r50k_base")
    if reason is None:  # the file is cached on this machine: it counts
        assert answer.status_code == 200
        return
    assert answer.status_code == 400
    assert answer.json()["details"][0]["code"] == "counter_unavailable"
    assert reason in answer.json()["details"][0]["message"]


def test_a_lower_limit_of_the_app_is_enforced() -> None:
    from flowmem.server import Settings
    from flowmem.server._limits import Limits

    world = make_world(seed=False, settings=Settings(rate_limit=0.0,
                                                     limits=Limits(max_budget_tokens=50)))
    over = world.call("owner", "POST", "/v1/memory/history",
                      {"scope": "user", "key": "c", "max_tokens": 51})
    assert over.status_code == 400 and "at most 50" in over.json()["error"]


def test_the_schema_shows_the_budget_at_both_doors(world: World) -> None:
    schema = world.call("anonymous", "GET", "/openapi.json").json()
    body = schema["components"]["schemas"]["HistoryBody"]["properties"]
    assert {"max_tokens", "counter", "keep_system"} <= set(body)
    parameters = {p["name"]: p for p in
                  schema["paths"]["/v1/sessions/{session_id}/messages"]["get"]["parameters"]}
    assert {"max_tokens", "counter", "keep_system"} <= set(parameters)
    out = schema["components"]["schemas"]["HistoryOut"]["properties"]
    assert {"tokens", "omitted"} <= set(out)
