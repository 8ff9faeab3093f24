"""The storage API over HTTP: MEM-7, MEM-8, MEM-9, MEM-15, the turn semantics, the limits."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from flowmem.access import Action, Level, Principal, SessionRecord
from flowmem.errors import StoreUnavailable
from flowmem.server import Limits, Settings, hash_token
from flowmem.service._changes import announce
from flowmem.service._registry import RESERVED_SCOPE, reserved
from server_support import USERS, World, make_world

CALL = {"role": "assistant", "content": None,
        "tool_calls": [{"id": "c1", "type": "function",
                        "function": {"name": "lookup", "arguments": "{}"}}]}
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "42"}


@pytest.fixture
def world() -> World:
    return make_world()


def memory_op(world: World, role: str, op: str, **body: Any) -> Any:
    response = world.call(role, "POST", f"/v1/memory/{op}", body)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["success"] is True
    return body["data"]


def all_keys(world: World) -> list[tuple[str, str, str]]:
    data = world.memory.store._store._data  # type: ignore[attr-defined]  # memory:// only
    return [(k.scope, k.scope_id, k.key) for k in data if k.scope != RESERVED_SCOPE]


OPEN = Settings(anonymous=Level.WRITE, rate_limit=0.0)  # the --anonymous write opt-in


# -- MEM-7: a refusal is neutral and reaches no backend ---------------------------------------
def test_mem7_anonymous_user_scope_is_refused_neutrally_and_nothing_stored(
        caplog: pytest.LogCaptureFixture) -> None:
    world = make_world(settings=OPEN)
    before = all_keys(world)
    with caplog.at_level(logging.WARNING, logger="flowmem"):
        write = memory_op(world, "anonymous", "write", scope="user", key="k", value="v",
                          context={"node_id": "n1", "workflow_id": "w1"})
        read = memory_op(world, "anonymous", "read", scope="user", key="k", default="d")
        delete = memory_op(world, "anonymous", "delete", scope="user", key="k")
        append = memory_op(world, "anonymous", "append", scope="user", key="k",
                           messages=[{"role": "user", "content": "hi"}])
    assert write == {"scope": "user", "resolved_scope_id": "", "refused": True, "ok": False}
    assert read == {"scope": "user", "resolved_scope_id": "", "refused": True,
                    "value": "d", "found": False, "written_by": None}
    assert delete == {"scope": "user", "resolved_scope_id": "", "refused": True,
                      "ok": False, "found": False}
    assert append == {"scope": "user", "resolved_scope_id": "", "refused": True, "count": 0,
                      "appended": 0, "appended_any": False, "replaced": 0, "dropped_results": 0,
                      "dropped_turns": 0, "healed": 0, "messages": [], "before": None}
    assert all_keys(world) == before  # no fallback bucket, nothing stored
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 4 and "'n1'" in refusals[0].getMessage()


def test_memory_history_pages_a_conversation_and_refuses_neutrally() -> None:
    """MEM-14/MEM-7: a runtime reads the last N messages without loading the whole buffer."""
    world = make_world(settings=OPEN)
    messages = [{"role": "user", "content": str(i)} for i in range(5)]
    memory_op(world, "owner", "append", scope="user", key="chat", messages=messages)
    page = memory_op(world, "owner", "history", scope="user", key="chat", last=2)
    assert [m["message"]["content"] for m in page["messages"]] == ["3", "4"]
    assert page["resolved_scope_id"] == "alice" and page["before"] is not None
    older = memory_op(world, "owner", "history", scope="user", key="chat", last=10,
                      before=page["before"])
    assert [m["message"]["content"] for m in older["messages"]] == ["0", "1", "2"]
    assert older["before"] is None
    refused = memory_op(world, "anonymous", "history", scope="user", key="chat")
    assert refused == {"scope": "user", "resolved_scope_id": "", "refused": True,
                       "messages": [], "before": None}


def test_mem7_session_scope_without_a_session_is_refused(world: World) -> None:
    result = memory_op(world, "owner", "write", scope="session", key="k", value=1)
    assert result["refused"] and not result["ok"]
    assert ("session", "", "k") not in all_keys(world)


def test_user_scope_of_an_identified_caller_is_its_own(world: World) -> None:
    assert memory_op(world, "owner", "write", scope="user", key="k", value="mine")["ok"]
    other = memory_op(world, "other", "read", scope="user", key="k")
    assert other["resolved_scope_id"] == "carol" and not other["found"]
    mine = memory_op(world, "owner", "read", scope="user", key="k")
    assert mine == {"scope": "user", "resolved_scope_id": "alice", "refused": False,
                    "value": "mine", "found": True, "written_by": None}


def test_global_and_workflow_scopes_come_from_the_request(world: World) -> None:
    world.tokens["svc"] = world.token_for("svc", grants=["workflow:wf:write"])
    world.tokens["reader"] = world.token_for("reader", grants=["workflow:*:read"])
    memory_op(world, "svc", "write", scope="workflow", key="k", value=1,
              context={"workflow_id": "wf"})
    read = memory_op(world, "reader", "read", scope="workflow", key="k",
                     context={"workflow_id": "wf"})
    assert read["found"] and read["resolved_scope_id"] == "wf"
    assert read["written_by"] == "svc"  # the writing principal of a shared-scope value


# -- MEM-8: the memory principal of a session is its owner ----------------------------------
def test_mem8_admin_driving_a_session_writes_the_owners_user_scope(world: World) -> None:
    sid = world.session_id
    wrote = memory_op(world, "admin", "write", scope="user", key="pref", value="x",
                      session_id=sid)
    assert wrote["resolved_scope_id"] == USERS["owner"]  # never the driver ("root")
    mine = memory_op(world, "owner", "read", scope="user", key="pref")
    assert mine["found"] and mine["value"] == "x"
    admins = memory_op(world, "admin", "read", scope="user", key="pref")
    assert not admins["found"]


def test_mem8_reading_under_a_session_reads_the_owners_scope(world: World) -> None:
    memory_op(world, "owner", "write", scope="user", key="pref", value="v")
    read = memory_op(world, "admin", "read", scope="user", key="pref",
                     session_id=world.session_id)
    assert read["resolved_scope_id"] == USERS["owner"] and read["value"] == "v"
    viewer = world.call("viewer", "POST", "/v1/memory/read",  # viewing never reaches memory
                        {"scope": "user", "key": "pref", "session_id": world.session_id})
    assert viewer.status_code == 403 and "v" not in viewer.json()


def test_mem8_ownerless_session_refuses_the_user_scope(world: World) -> None:
    sid = world.new_session("admin", "shared", owner_less=True)
    result = memory_op(world, "admin", "write", scope="user", key="k", value=1, session_id=sid)
    assert result["refused"] and result["resolved_scope_id"] == ""
    assert ("user", USERS["admin"], "k") not in all_keys(world)
    session = memory_op(world, "admin", "write", scope="session", key="k", value=1,
                        session_id=sid)
    assert session["resolved_scope_id"] == sid


def test_mem8_session_scope_is_the_session(world: World) -> None:
    sid = world.session_id
    memory_op(world, "owner", "write", scope="session", key="notes", value="n", session_id=sid)
    read = memory_op(world, "admin", "read", scope="session", key="notes", session_id=sid)
    assert read["resolved_scope_id"] == sid and read["value"] == "n"


def test_identity_never_comes_from_the_body(world: World) -> None:
    response = world.call("other", "POST", "/v1/memory/write",
                          {"scope": "user", "key": "k", "value": 1,
                           "context": {"user_id": "alice"}})
    assert response.status_code == 400 and "user_id" in response.json()["error"]
    response = world.call("other", "POST", "/v1/sessions", {"title": "t", "owner": "alice"})
    assert response.status_code == 400
    response = world.call("other", "POST", "/v1/memory/read",
                          {"scope": "user", "key": "k", "user_id": "alice"})
    assert response.status_code == 400


# -- sessions and turns (MEM-1..14 through Memory.append) -------------------------------------
def turn(world: World, role: str, *messages: dict[str, Any], sid: str | None = None) -> Any:
    response = world.call(role, "POST", f"/v1/sessions/{sid or world.session_id}/turns",
                          {"messages": list(messages)})
    assert response.status_code == 200, response.text
    return response.json()["data"]


def test_turns_have_the_full_append_semantics(world: World) -> None:
    first = turn(world, "owner", {"role": "user", "content": "what is 6*7?"}, CALL, RESULT)
    assert (first["count"], first["appended"], first["appended_any"]) == (4, 3, True)
    refired = turn(world, "owner", RESULT)  # MEM-1: a re-fired result is dropped
    assert (refired["count"], refired["appended"], refired["appended_any"]) == (4, 0, False)
    turn(world, "owner", {**CALL, "tool_calls": [{**CALL["tool_calls"][0], "id": "c2"}]})
    healed = turn(world, "owner", {"role": "user", "content": "and?"})  # MEM-3
    assert (healed["count"], healed["appended"]) == (7, 1)
    messages = [m["message"] for m in healed["messages"]]
    assert messages[5]["metadata"] == {"tool_call_id": "c2", "healed": True}
    late = turn(world, "owner", {"role": "tool", "tool_call_id": "c2", "content": "late"})
    assert late["appended"] == 0  # MEM-10: replaces the placeholder in place
    assert late["messages"][5]["message"]["content"] == "late"


def test_stop_and_reset(world: World) -> None:
    sid = world.session_id
    memory_op(world, "owner", "write", scope="session", key="notes", value=1, session_id=sid)
    stopped = world.call("owner", "POST", f"/v1/sessions/{sid}/stop")
    assert stopped.json()["data"]["status"] == "stopped"
    refused = world.call("owner", "POST", f"/v1/sessions/{sid}/turns",
                         {"messages": [{"role": "user", "content": "x"}]})
    assert refused.status_code == 409 and refused.json()["error_code"] == "session_stopped"
    reset = world.call("owner", "POST", f"/v1/sessions/{sid}/reset")
    assert reset.json()["data"]["status"] == "idle"  # nothing ran since the reset (STORE-12)
    page = world.call("owner", "GET", f"/v1/sessions/{sid}/messages").json()
    assert page["data"]["messages"] == [] and page["pagination"]["total"] == 0
    notes = memory_op(world, "owner", "read", scope="session", key="notes", session_id=sid)
    assert not notes["found"]


def test_messages_are_paginated_with_cursors(world: World) -> None:
    for i in range(6):
        turn(world, "owner", {"role": "user", "content": f"m{i}"})
    seen: list[str] = []
    before = None
    for _ in range(10):
        params = {"limit": 3} if before is None else {"limit": 3, "before": before}
        page = world.call("viewer", "GET", f"/v1/sessions/{world.session_id}/messages",
                          params=params).json()["data"]
        seen = [m["message"]["content"] for m in page["messages"]] + seen
        before = page["before"]
        if before is None:
            break
    assert seen == ["hello"] + [f"m{i}" for i in range(6)]


def test_mem15_only_admin_edits_messages(world: World) -> None:
    sid = world.session_id
    url = f"/v1/sessions/{sid}/messages/0"
    edit = {"message": {"role": "user", "content": "redacted"}}
    assert world.call("owner", "PUT", url, edit).status_code == 403
    assert world.call("owner", "DELETE", url).status_code == 403
    updated = world.call("admin", "PUT", url, edit)
    assert updated.status_code == 200
    assert updated.json()["data"]["message"]["content"] == "redacted"
    assert world.call("admin", "PUT", f"/v1/sessions/{sid}/messages/99", edit).status_code == 404
    deleted = world.call("admin", "DELETE", url)
    assert deleted.status_code == 200
    assert deleted.json()["data"]["message"]["content"] == "redacted"
    gone = world.call("admin", "DELETE", url)
    assert gone.status_code == 404 and gone.json()["error_code"] == "message_not_found"
    page = world.call("owner", "GET", f"/v1/sessions/{sid}/messages").json()["data"]
    assert page["messages"] == []


def test_mem15_hook_adds_denials_over_http() -> None:
    def no_drive(principal: Principal, action: Action, session: SessionRecord | None) -> bool:
        return action is not Action.DRIVE

    world = make_world(settings=Settings(hooks=(no_drive,)), seed=False)
    sid = world.new_session("owner")
    denied = world.call("owner", "POST", f"/v1/sessions/{sid}/turns",
                        {"messages": [{"role": "user", "content": "x"}]})
    assert denied.status_code == 403 and "hook" in denied.json()["error"]
    assert denied.json()["error_code"] == "forbidden"
    assert world.call("owner", "GET", f"/v1/sessions/{sid}").status_code == 200


def test_mem15_hook_cannot_let_a_viewer_drive() -> None:
    world = make_world(settings=Settings(hooks=(lambda *_: True,)))
    sid = world.session_id
    assert world.call("viewer", "POST", f"/v1/sessions/{sid}/stop").status_code == 403
    assert world.call("viewer", "PUT", f"/v1/sessions/{sid}/messages/0",
                      {"message": {"role": "user", "content": "x"}}).status_code == 403
    assert world.call("other", "GET", f"/v1/sessions/{sid}").status_code == 404


def test_grant_and_revoke_view(world: World) -> None:
    sid = world.session_id
    assert world.call("other", "GET", f"/v1/sessions/{sid}").status_code == 404
    granted = world.call("owner", "POST", f"/v1/sessions/{sid}/viewers", {"user_id": "carol"})
    assert "carol" in granted.json()["data"]["viewers"]
    assert world.call("other", "GET", f"/v1/sessions/{sid}").json()["data"]["viewers"] == []
    shared = world.call("other", "GET", "/v1/sessions", params={"role": "viewer"}).json()
    assert [s["id"] for s in shared["data"]] == [sid] and shared["pagination"]["total"] == 1
    world.call("owner", "DELETE", f"/v1/sessions/{sid}/viewers/carol")
    assert world.call("other", "GET", f"/v1/sessions/{sid}").status_code == 404
    shared = world.call("other", "GET", "/v1/sessions", params={"role": "viewer"}).json()
    assert shared["data"] == [] and shared["pagination"]["total"] == 0


def test_list_mine_pages(world: World) -> None:
    made = {world.session_id} | {world.new_session("owner", f"s{i}") for i in range(4)}
    world.new_session("other", "not mine")
    seen: list[str] = []
    offset = 0
    while True:
        page = world.call("owner", "GET", "/v1/sessions",
                          params={"limit": 2, "offset": offset}).json()
        assert page["pagination"] == {"total": 5, "limit": 2, "offset": offset,
                                      "has_more": offset + 2 < 5}
        seen += [s["id"] for s in page["data"]]
        offset += 2
        if not page["pagination"]["has_more"]:
            break
    assert sorted(seen) == sorted(made)


# -- authentication -----------------------------------------------------------------------------
def test_tokens_are_stored_hashed(world: World) -> None:
    token = world.tokens["owner"]
    found, record = world.run(world.memory.store.read, reserved("tokens", hash_token(token)))
    assert found and record["user_id"] == "alice" and token not in repr(record)
    assert token not in repr(world.memory.store._store._data)  # type: ignore[attr-defined]


@pytest.mark.parametrize("header", ["Bearer nope", "Basic YWxpY2U6eA==", "Bearer", "x"])
def test_a_bad_credential_is_refused_not_anonymous(world: World, header: str) -> None:
    response = world.client.get("/v1/whoami", headers={"Authorization": header})
    assert response.status_code == 401 and response.json()["error_code"] == "invalid_token"
    assert response.headers["www-authenticate"].startswith("Bearer")


def test_whoami(world: World) -> None:
    assert world.call("anonymous", "GET", "/v1/whoami").status_code == 401  # closed by default
    assert world.call("owner", "GET", "/v1/whoami").json() == {"success": True, "data": {
        "user_id": "alice", "admin": False, "anonymous": False}}
    assert make_world(settings=OPEN).call("anonymous", "GET", "/v1/whoami").json() == {
        "success": True, "data": {"user_id": None, "admin": False, "anonymous": True}}
    assert world.call("admin", "GET", "/v1/whoami").json()["data"]["admin"] is True


# -- limits and errors ----------------------------------------------------------------------------
SMALL = Settings(limits=Limits(max_body_bytes=4096, max_json_depth=8,
                               max_messages_per_append=3, max_content_chars=100))


def test_limits_answer_clear_errors() -> None:
    world = make_world(settings=SMALL)
    url = f"/v1/sessions/{world.session_id}/turns"
    big = world.call("owner", "POST", url, {"messages": [{"role": "user", "content": "x" * 5000}]})
    assert big.status_code == 400 and big.json()["error_code"] == "body_too_large"  # STORE-1
    many = world.call("owner", "POST", url, {"messages": [{"role": "user"}] * 4})
    assert many.status_code == 400 and "at most 3 messages" in many.json()["error"]
    assert many.json()["error_code"] == "too_many_messages"
    long = world.call("owner", "POST", url, {"messages": [{"role": "user", "content": "y" * 101}]})
    assert long.status_code == 400 and "content" in long.json()["error"]
    assert long.json()["error_code"] == "message_too_large"
    nested: Any = 1
    for _ in range(9):
        nested = [nested]
    deep = world.call("owner", "POST", "/v1/memory/write",
                      {"scope": "global", "key": "k", "value": nested})
    assert deep.status_code == 400 and "deeper than 8" in deep.json()["error"]
    assert deep.json()["error_code"] == "body_too_deep"


@pytest.mark.parametrize("body", [b"[" * 100_000, b"{" * 100_000, b'{"a":' * 50_000,
                                  b"{not json", b"\xff\xfe", b"", b"null", b"[]", b'"x"'])
def test_hostile_bodies_are_400_never_500(world: World, body: bytes) -> None:
    response = world.client.post("/v1/memory/write", content=body,
                                 headers={**world.headers("owner"),
                                          "Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    assert response.json()["success"] is False and response.json()["error_code"].startswith(
        ("body_", "invalid_field"))


def test_unknown_fields_are_400(world: World) -> None:
    response = world.call("owner", "POST", f"/v1/sessions/{world.session_id}/turns",
                          {"messages": [{"role": "user"}], "extra": 1})
    assert response.status_code == 400 and response.json()["error_code"] == "invalid_field"
    assert response.json()["details"][0]["locator"] == "body.extra"


def test_lone_surrogates_round_trip(world: World) -> None:
    text = "a\ud800b\udfff\x00"
    assert memory_op(world, "owner", "write", scope="user", key="k", value=[text])["ok"]
    assert memory_op(world, "owner", "read", scope="user", key="k")["value"] == [text]
    bad_key = world.call("owner", "POST", "/v1/memory/read", {"scope": "user", "key": "k\udc80"})
    assert bad_key.status_code == 400  # a key is text: refused cleanly, never a 500
    result = turn(world, "owner", {"role": "user", "content": text})
    assert result["messages"][-1]["message"]["content"] == text


def test_key_conflict_is_409(world: World) -> None:
    memory_op(world, "admin", "write", scope="global", key="k", value=1)
    response = world.call("admin", "POST", "/v1/memory/append",
                          {"scope": "global", "key": "k", "messages": [{"role": "user"}]})
    assert response.status_code == 409 and response.json()["error_code"] == "key_conflict"


def test_invalid_message_is_400(world: World) -> None:
    response = world.call("owner", "POST", f"/v1/sessions/{world.session_id}/turns",
                          {"messages": [{"role": "assistant", "tool_calls": ["not a dict"]}]})
    assert response.status_code == 400
    response = world.call("owner", "POST", "/v1/memory/read", {"scope": "galaxy", "key": "k"})
    assert response.status_code == 400
    response = world.call("owner", "POST", "/v1/memory/read", {"scope": "user", "key": "a\x00"})
    assert response.status_code == 400


def test_store_failure_is_503(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    async def down(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("database is down")

    monkeypatch.setattr(world.memory.store, "write", down)
    response = world.call("owner", "POST", "/v1/memory/write",
                          {"scope": "user", "key": "k", "value": 1})
    assert response.status_code == 503 and response.json()["error_code"] == "store_unavailable"
    assert "database is down" not in response.text  # API-7: the driver's text stays in the log


def test_reserved_scope_is_unreachable_through_memory(world: World) -> None:
    response = world.call("admin", "POST", "/v1/memory/read",
                          {"scope": RESERVED_SCOPE, "key": hash_token(world.tokens["owner"])})
    assert response.status_code == 400


def test_openapi_documents_limits_refusal_and_no_422(world: World) -> None:
    schema = world.call("anonymous", "GET", "/openapi.json").json()
    text = str(schema)
    # the one 422 is a reused Idempotency-Key; FastAPI's validation 422 never answers
    answer = schema["paths"]["/v1/memory/read"]["post"]["responses"]["422"]
    assert answer["description"] == "Refused: `idempotency_key_reused`."
    for status in ("400", "401", "403", "404", "409", "429", "500", "503"):
        assert status in schema["paths"]["/v1/memory/append"]["post"]["responses"]
    assert "413" not in schema["paths"]["/v1/memory/append"]["post"]["responses"]
    assert "refused: true" in schema["info"]["description"]
    assert "nested at most 63 levels" in schema["info"]["description"]
    assert "At most 100 messages per append" in text


def test_mem15_message_of_an_unloadable_session_is_denied(world: World) -> None:
    sid = world.session_id
    world.run(world.memory.store.write, reserved("sessions", sid), "not a session record")
    world.run(announce, world.memory.store)  # a change made outside the registry, announced
    edit = {"message": {"role": "user", "content": "x"}}
    for role in ("admin", "owner"):
        assert world.call(role, "PUT", f"/v1/sessions/{sid}/messages/0", edit).status_code == 404
        assert world.call(role, "DELETE", f"/v1/sessions/{sid}/messages/0").status_code == 404
        assert world.call(role, "GET", f"/v1/sessions/{sid}/messages").status_code == 404


def test_a_replayed_write_keeps_the_writer_of_the_value_there_now(world: World) -> None:
    # a retry replays the first write without writing: if someone wrote since, the value
    # is theirs, and written_by must not name the retrying caller again
    world.tokens["svc"] = world.token_for("svc", grants=["workflow:wf:write"])
    world.tokens["ops"] = world.token_for("ops", grants=["workflow:wf:write"])
    where = {"scope": "workflow", "key": "k", "context": {"workflow_id": "wf"}}

    def write(role: str, value: int, key: str | None = None) -> Any:
        headers = {**world.headers(role), "Content-Type": "application/json"}
        if key is not None:
            headers["Idempotency-Key"] = key
        return world.client.post("/v1/memory/write", json={**where, "value": value},
                                 headers=headers)

    assert write("svc", 1, "retry-1").status_code == 200
    assert write("ops", 2).status_code == 200
    replay = write("svc", 1, "retry-1")
    assert replay.status_code == 200 and replay.headers["Idempotent-Replayed"] == "true"
    read = memory_op(world, "ops", "read", **where)
    assert (read["value"], read["written_by"]) == (2, "ops")
    assert write("svc", 3, "retry-2").status_code == 200  # the first call's record went
    world.run(world.app.state.flowmem.writers.forget, "workflow", "wf", "k")
    assert write("svc", 3, "retry-2").headers["Idempotent-Replayed"] == "true"
    assert memory_op(world, "ops", "read", **where)["written_by"] == "svc"  # recorded again
