"""``POST /v1/memory/compact``: the library's compaction at the administrative tier (MEM-15).

An admin replaces everything older than a kept tail by the summary it sends;
everyone else is refused before anything is read, and nothing changes; a
repeat under the same ``Idempotency-Key`` replays; bad fields are 400.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from flowmem import is_sendable
from flowmem.service._sessions import TRANSCRIPT_KEY
from server_support import World, make_world

CALL = {"type": "function", "function": {"name": "search", "arguments": "{}"}}


def _turns(count: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for i in range(count):
        out += [{"role": "user", "content": f"question {i}"},
                {"role": "assistant", "content": None, "tool_calls": [{**CALL, "id": f"c{i}"}]},
                {"role": "tool", "tool_call_id": f"c{i}", "content": f"result {i}"},
                {"role": "assistant", "content": f"answer {i}"}]
    return out


@pytest.fixture
def world() -> World:
    world = make_world(seed=False)
    world.session_id = world.new_session("owner", "long")
    assert world.call("owner", "POST", f"/v1/sessions/{world.session_id}/viewers",
                      {"user_id": "bob"}).status_code == 200
    assert world.call("owner", "POST", f"/v1/sessions/{world.session_id}/turns",
                      {"messages": _turns(6)}).status_code == 200
    return world


def _body(world: World, **fields: Any) -> dict[str, Any]:
    return {"scope": "session", "key": TRANSCRIPT_KEY, "session_id": world.session_id,
            "keep_last": 4, "summary": "Six questions about search were answered.", **fields}


def _keyed(world: World, body: dict[str, Any], key: str) -> Any:
    headers = {**world.headers("admin"), "Idempotency-Key": key,
               "Content-Type": "application/json"}
    return world.client.request("POST", "/v1/memory/compact", content=json.dumps(body),
                                headers=headers)


def _stored(world: World) -> list[dict[str, Any]]:
    page = world.call("owner", "GET", f"/v1/sessions/{world.session_id}/messages",
                      params={"limit": 100}).json()["data"]["messages"]
    return [p["message"] for p in page]


def test_an_admin_compacts_a_session_and_a_repeat_replays(world: World) -> None:
    before = _stored(world)
    positions = [p["position"] for p in world.call(
        "owner", "GET", f"/v1/sessions/{world.session_id}/messages",
        params={"limit": 100}).json()["data"]["messages"]]
    answer = _keyed(world, _body(world), "nightly-1")
    assert answer.status_code == 200, answer.text
    data = answer.json()["data"]
    assert (data["replaced"], data["count"], data["refused"]) == (20, 25 - 19, False)
    assert (data["first"], data["last"], data["replayed"]) == (positions[1], positions[20],
                                                               False)
    assert data["position"] == positions[1]
    after = _stored(world)
    assert after[0] == before[0] and after[2:] == before[-4:]
    assert after[1]["role"] == "system" and after[1]["content"] == data["summary"]["content"]
    assert after[1]["metadata"]["compacted"]["count"] == 20
    assert is_sendable(after)
    again = _keyed(world, _body(world, summary="another text"), "nightly-1")
    assert again.status_code == 200 and again.json()["data"]["replayed"] is True
    assert again.json()["data"]["summary"] == data["summary"] and _stored(world) == after
    # the summary leads a budgeted read among the system messages
    budgeted = world.call("viewer", "GET", f"/v1/sessions/{world.session_id}/messages",
                          params={"max_tokens": 10_000}).json()["data"]
    assert budgeted["messages"][1]["message"] == after[1] and budgeted["omitted"] == 0


def test_nothing_to_compact_is_a_success_that_changes_nothing(world: World) -> None:
    before = _stored(world)
    answer = world.call("admin", "POST", "/v1/memory/compact", _body(world, keep_last=1000))
    assert answer.status_code == 200
    assert (answer.json()["data"]["replaced"], answer.json()["data"]["summary"]) == (0, None)
    assert _stored(world) == before


@pytest.mark.parametrize(("role", "in_session", "in_own_scope"), [
    ("owner", "messages_immutable", "messages_immutable"),
    ("viewer", "forbidden", "messages_immutable"),  # a viewer never drives (MEM-9)
    ("other", "session_not_found", "messages_immutable"),  # absence before denial
    ("anonymous", "unauthenticated", "unauthenticated")])
def test_below_the_administrative_tier_it_is_refused(world: World, role: str, in_session: str,
                                                      in_own_scope: str) -> None:
    before = _stored(world)
    own = {"scope": "user", "key": "c", "keep_last": 0, "summary": "s"}
    for body, code in ((_body(world), in_session), (own, in_own_scope)):
        answer = world.call(role, "POST", "/v1/memory/compact", body)
        assert answer.json()["error_code"] == code
    assert _stored(world) == before


def test_a_shared_scope_a_refused_scope_and_a_stopped_session(world: World) -> None:
    shared = {"scope": "workflow", "key": "chat", "context": {"workflow_id": "w"}}
    assert world.call("admin", "POST", "/v1/memory/append",
                      {**shared, "messages": _turns(3)}).status_code == 200
    done = world.call("admin", "POST", "/v1/memory/compact",
                      {**shared, "keep_last_tokens": 80, "summary": "s"})
    assert done.status_code == 200 and done.json()["data"]["replaced"] > 0
    refused = world.call("admin", "POST", "/v1/memory/compact",
                         {"scope": "session", "key": "c", "keep_last": 0, "summary": "s"})
    assert refused.status_code == 200 and refused.json()["data"]["refused"] is True
    world.call("owner", "POST", f"/v1/sessions/{world.session_id}/stop")
    stopped = world.call("admin", "POST", "/v1/memory/compact", _body(world))
    assert (stopped.status_code, stopped.json()["error_code"]) == (409, "session_stopped")


@pytest.mark.parametrize("fields", [
    {"keep_last_tokens": 10}, {"keep_last": None}, {"keep_last": -1}, {"keep_last": "4"},
    {"summary": ""}, {"summary": 5}, {"counter": "nope"}, {"format": "xml"},
    {"keep_last": None, "keep_last_tokens": 10**12}, {"unknown": 1}])
def test_bad_fields_are_400_and_change_nothing(world: World, fields: dict[str, Any]) -> None:
    before = _stored(world)
    answer = world.call("admin", "POST", "/v1/memory/compact", _body(world, **fields))
    assert (answer.status_code, answer.json()["error_code"]) == (400, "invalid_field")
    assert _stored(world) == before
