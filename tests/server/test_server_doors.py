"""The storage-api door rules over HTTP: STORE-1/API-1 (one body gate), API-5/6 (envelopes,
clamped paging), API-7 (generic failures), API-8 (error codes), STORE-11/12 (session status).

Every response these tests receive is also checked by ``server_support.check_envelope``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from figures import Figure
from flowmem.async_memory import AsyncMemory
from flowmem.errors import OutcomeUnknown, StoreBusy, StoreError, StoreUnavailable
from flowmem.server import create_app
from flowmem.server._responses import ERROR_CODES
from flowmem.service._changes import announce
from flowmem.service._registry import reserved
from server_support import REFUSALS, CheckedClient, World, app_routes, make_world

DOCS = Path(__file__).resolve().parents[2] / "docs" / "http.md"
MIB = 1_048_576


def _url(path: str, world: World) -> str:
    return (path.replace("{session_id}", world.session_id).replace("{user_id}", "bob")
            .replace("{position}", "0").replace("{asset}", "app.js"))


def _nested(depth: int) -> bytes:
    """An object whose nesting depth is ``depth`` (the top level counts as 1)."""
    return b'{"a":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


HOSTILE = {
    "not JSON": (b"{not json", "application/json", "body_not_json"),
    "unterminated": (b'{"x":', "application/json", "body_not_json"),
    "bad UTF-8": (b'{"a": "\xff\xfe"}', "application/json", "body_not_json"),
    "text/plain": (b'{"a": 1}', "text/plain", "body_not_json"),
    "no content type": (b'{"a": 1}', None, "body_not_json"),
    "a string": (b'"x"', "application/json", "body_not_container"),
    "null": (b"null", "application/json", "body_not_container"),
    "a number": (b"5", "application/json", "body_not_container"),
    "depth 64": (_nested(64), "application/json", "body_too_deep"),
    "a megabyte of [": (b"[" * MIB, "application/json", "body_too_deep"),
    "NaN": (b'{"a": NaN}', "application/json", "body_bad_number"),
    "Infinity": (b'{"a": [-Infinity]}', "application/json", "body_bad_number"),
    "1e999": (b'{"a": 1e999}', "application/json", "body_bad_number"),
    "5000-digit float": (b'{"a": ' + b"9" * 5000 + b'.5}', "application/json",
                         "body_bad_number"),
    "5000-digit integer": (b'{"a": ' + b"9" * 5000 + b"}", "application/json",
                           "body_bad_number"),
}
ROUTES = sorted(app_routes(make_world(seed=False).app))


@pytest.mark.parametrize(("method", "path"), ROUTES, ids=[f"{m} {p}" for m, p in ROUTES])
def test_every_door_runs_the_one_gate(method: str, path: str) -> None:
    """STORE-1/API-1: the same refusal, 400 with the gate's code, on every route."""
    world = make_world()
    for name, (body, kind, code) in HOSTILE.items():
        headers = world.headers("admin")
        if kind:
            headers["Content-Type"] = kind
        response = world.client.request(method, _url(path, world), content=body,
                                        headers=headers)
        assert (response.status_code, response.json()["error_code"]) == (400, code), name


def test_the_size_limit_is_8_mib_and_refused_with_400() -> None:
    world = make_world()
    headers = {**world.headers("owner"), "Content-Type": "application/json"}
    prefix = b'{"scope": "user", "key": "big", "value": "'
    fits = prefix + b"x" * (8 * MIB - len(prefix) - 2) + b'"}'
    assert len(fits) == 8 * MIB
    response = world.client.post("/v1/memory/write", content=fits, headers=headers)
    assert response.json()["error_code"] == "value_too_large"  # past the gate: the door's own
    over = fits[:-2] + b'x"}'
    response = world.client.post("/v1/memory/write", content=over, headers=headers)
    assert (response.status_code, response.json()["error_code"]) == (400, "body_too_large")


def test_depth_63_passes_the_gate_on_every_body_door() -> None:
    world = make_world()
    value = json.loads(_nested(62))  # 62 levels inside the body's own object: 63
    response = world.call("owner", "POST", "/v1/memory/write",
                          {"scope": "user", "key": "deep", "value": value})
    assert response.status_code == 200, response.text
    assert world.call("owner", "POST", "/v1/memory/read",
                      {"scope": "user", "key": "deep"}).json()["data"]["value"] == value
    for method, path in ROUTES:
        if method in ("POST", "PUT"):
            response = world.client.request(
                method, _url(path, world), content=_nested(63),
                headers={**world.headers("admin"), "Content-Type": "application/json"})
            assert not response.json().get("error_code", "").startswith("body_"), path


@pytest.mark.parametrize("door", ["stop", "reset"])
def test_optional_bodies_read_as_empty_and_are_gated(door: str) -> None:
    """API-1: absent reads as {}; anything present goes through the gate and the door."""
    world = make_world()
    url = f"/v1/sessions/{world.session_id}/{door}"
    headers = {**world.headers("owner"), "Content-Type": "application/json"}
    for body, code in ((b'"x"', "body_not_container"), (b'{"x":', "body_not_json"),
                       (b"\xff", "body_not_json"), (b'{"x": 1}', "invalid_field"),
                       (b"[]", "invalid_field")):
        response = world.client.post(url, content=body, headers=headers)
        assert (response.status_code, response.json()["error_code"]) == (400, code), body
    assert world.client.post(url, headers=world.headers("owner")).status_code == 200
    assert world.client.post(url, content=b"{}", headers=headers).status_code == 200


# -- API-5 / API-6 -----------------------------------------------------------------------------
def test_session_list_paging_is_clamped_and_reported() -> None:
    world = make_world()
    for i in range(4):
        world.new_session("owner", f"s{i}")
    world.new_session("other", "not mine")

    def page(**params: Any) -> dict[str, Any]:
        response = world.call("owner", "GET", "/v1/sessions", params=params)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    assert page(limit=1000)["pagination"] == {"total": 5, "limit": 100, "offset": 0,
                                              "has_more": False}
    assert page(limit=0)["pagination"]["limit"] == 1
    assert page(limit=-3, offset=-5)["pagination"] == {"total": 5, "limit": 1, "offset": 0,
                                                       "has_more": True}
    last = page(limit=2, offset=4)
    assert len(last["data"]) == 1 and last["pagination"]["has_more"] is False
    beyond = page(offset=10**30)
    assert beyond["data"] == [] and beyond["pagination"]["total"] == 5
    viewer = world.call("viewer", "GET", "/v1/sessions", params={"role": "viewer"}).json()
    assert viewer["pagination"]["total"] == 1  # counted under the filter


def test_history_doors_page_by_limit_offset_and_cursor() -> None:
    world = make_world(seed=False)
    sid = world.new_session("owner")
    messages = [{"role": "user", "content": f"m{i}"} for i in range(7)]
    world.call("owner", "POST", f"/v1/sessions/{sid}/turns", {"messages": messages})
    url = f"/v1/sessions/{sid}/messages"

    def contents(body: dict[str, Any]) -> list[str]:
        return [m["message"]["content"] for m in body["data"]["messages"]]

    newest = world.call("owner", "GET", url, params={"limit": 3}).json()
    assert contents(newest) == ["m4", "m5", "m6"]
    assert newest["pagination"] == {"total": 7, "limit": 3, "offset": 0, "has_more": True}
    skipped = world.call("owner", "GET", url, params={"limit": 3, "offset": 3}).json()
    assert contents(skipped) == ["m1", "m2", "m3"]
    cursor = world.call("owner", "GET", url, params={"limit": 3,
                                                     "before": newest["data"]["before"]}).json()
    assert contents(cursor) == ["m1", "m2", "m3"]
    # API-6: the total is the conversation's, counted before paging; the cursor pages
    assert cursor["pagination"] == {"total": 7, "limit": 3, "offset": 0, "has_more": True}
    oldest = world.call("owner", "GET", url, params={"limit": 3,
                                                     "before": cursor["data"]["before"]}).json()
    assert contents(oldest) == ["m0"] and oldest["pagination"]["total"] == 7
    body = {"scope": "session", "key": "transcript", "session_id": sid}
    paged = world.call("owner", "POST", "/v1/memory/history",
                       {**body, "limit": 2, "before": newest["data"]["before"]}).json()
    assert contents(paged) == ["m2", "m3"] and paged["pagination"]["total"] == 7
    clamped = world.call("owner", "GET", url, params={"limit": 10**6, "offset": -1}).json()
    assert len(contents(clamped)) == 7 and clamped["pagination"]["limit"] == 100
    body = {"scope": "session", "key": "transcript", "session_id": sid}
    memory = world.call("owner", "POST", "/v1/memory/history",
                        {**body, "limit": 2, "offset": 1}).json()
    assert contents(memory) == ["m4", "m5"] and memory["pagination"]["total"] == 7
    old_name = world.call("owner", "POST", "/v1/memory/history", {**body, "last": 500}).json()
    assert old_name["pagination"]["limit"] == 100


def test_field_refusals_are_located_as_the_body_names_them() -> None:
    """``body.messages.0.role`` (as docs/http.md says), never ``body.0.role`` nor a union
    member's internal type name (``body.messages.list[MessageIn]``)."""
    world = make_world(seed=False)
    sid = world.new_session("owner")
    cases = [({"messages": [{"role": 5, "content": "x"}]}, ["body.messages.0.role"]),
             ({"messages": [{"role": "user", "content": "x"}, {"content": "y"}]},
              ["body.messages.1.role"]),
             ({"messages": "x"}, ["body.messages"])]
    for body, locators in cases:
        for path, extra in (("/v1/memory/append", {"scope": "user", "key": "c"}),
                            (f"/v1/sessions/{sid}/turns", {})):
            refusal = world.call("owner", "POST", path, {**extra, **body}).json()
            assert refusal["error_code"] == "invalid_field", refusal
            assert [d["locator"] for d in refusal["details"]] == locators, refusal
            assert "[" not in refusal["error"], refusal


# -- API-7: generic failures and classified store errors -----------------------------------------
def test_store_failures_are_classified_with_fixed_messages(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    world = make_world()
    secret = "SQLite error: no such table: kv (/srv/secret/flowmem.db)"
    for error, status, code in ((StoreBusy(secret), 503, "store_busy"),
                                (StoreError(secret), 503, "store_failed"),
                                (StoreUnavailable(secret), 503, "store_unavailable"),
                                (OutcomeUnknown(secret), 503, "outcome_unknown"),
                                (RuntimeError(secret), 500, "internal_error")):
        async def fail(*args: Any, error: Exception = error, **kwargs: Any) -> Any:
            raise error

        monkeypatch.setattr(world.memory.store, "write", fail)
        with caplog.at_level(logging.ERROR, logger="flowmem"):
            response = world.call("owner", "POST", "/v1/memory/write",
                                  {"scope": "user", "key": "k", "value": 1})
        body = response.json()
        assert (response.status_code, body["error_code"]) == (status, code)
        assert "secret" not in response.text and "SQLite" not in response.text
        if code in ("store_busy", "outcome_unknown"):  # retry after a second
            assert response.headers["Retry-After"] == "1"
        if code == "outcome_unknown":  # never "nothing was changed"
            assert "may or may not" in body["error"] and "Idempotency-Key" in body["error"]
        if code != "store_busy":
            assert re.fullmatch(r"[0-9a-f]{16}", body["request_id"])
            assert any(body["request_id"] in r.getMessage() and
                       (secret in r.getMessage() or r.exc_info) for r in caplog.records)


def test_a_dropped_table_answers_without_driver_text_or_path(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    world = make_world(f"sqlite:///{path}")
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE kv")
    for role, method, url, body in (
            ("owner", "GET", f"/v1/sessions/{world.session_id}", None),
            ("owner", "POST", "/v1/memory/read", {"scope": "user", "key": "k"}),
            ("owner", "POST", "/v1/sessions", {"title": "t"})):
        response = world.call(role, method, url, body)
        assert response.status_code >= 500, response.text
        assert str(tmp_path) not in response.text and "kv" not in response.text
        assert "SQLite" not in response.text and "table" not in response.text
    world.close()


def test_a_read_only_database_refuses_writes_with_its_own_code(tmp_path: Path) -> None:
    """A read-only SQLite store (StoreReadOnly) answers ``store_read_only`` 503, one code
    for one refusal (API-8); reads still work; nothing changes."""
    url = f"sqlite:///{tmp_path / 'ro.db'}"
    world = make_world(url)
    token = world.tokens["owner"]
    written = world.call("owner", "POST", "/v1/memory/write",
                         {"scope": "user", "key": "k", "value": 1})
    assert written.status_code == 200, written.text
    world.close()
    memory = AsyncMemory.from_url(f"{url}?mode=ro")
    headers = {"Authorization": f"Bearer {token}"}
    with CheckedClient(create_app(memory)) as client:
        for path, body in (("/v1/memory/write", {"scope": "user", "key": "k", "value": 2}),
                           ("/v1/sessions", {"title": "t"})):
            refused = client.post(path, json=body, headers=headers)
            assert refused.status_code == 503, refused.text
            assert refused.json()["error_code"] == "store_read_only"
            assert str(tmp_path) not in refused.text
        read = client.post("/v1/memory/read", json={"scope": "user", "key": "k"},
                           headers=headers)
        assert read.status_code == 200 and read.json()["data"]["value"] == 1
        client.portal.call(memory.aclose)


def test_concurrent_updates_of_one_session_wait_for_each_other(tmp_path: Path) -> None:
    """Coroutines updating one session record queue in process (no lost update), never
    on the store's lock: SQLite's one connection thread must stay free for the holder."""
    world = make_world(f"sqlite:///{tmp_path / 'u.db'}", seed=False)
    sid = world.new_session("owner")
    registry = world.app.state.flowmem.sessions
    viewers = [f"v{i}" for i in range(8)]

    async def grant_all() -> list[Any]:
        return list(await asyncio.gather(*(registry.grant(sid, v) for v in viewers)))

    assert all(record is not None for record in world.run(grant_all))
    got = world.call("owner", "GET", f"/v1/sessions/{sid}").json()["data"]["viewers"]
    assert sorted(got) == viewers


# -- API-8: the published table ----------------------------------------------------------------
def test_the_docs_publish_exactly_the_codes_the_service_uses() -> None:
    rows = re.findall(r"^\| `([a-z_]+)` \| (\d{3}) \|", DOCS.read_text(encoding="utf-8"), re.M)
    assert {code: int(status) for code, status in rows} == {
        code: status for code, (status, _) in ERROR_CODES.items()}
    assert len(rows) == len(ERROR_CODES)  # each code published once


def test_the_schema_describes_the_envelopes() -> None:
    world = make_world(seed=False)
    schema = world.call("anonymous", "GET", "/openapi.json").json()
    error = schema["components"]["schemas"]["Error"]
    assert error["properties"]["error_code"]["enum"] == sorted(ERROR_CODES)
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            ok = next(v for k, v in operation["responses"].items() if k.startswith("2"))
            ref = ok["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
            assert ref.startswith(("Ok_", "Page_")), (method, path, ref)
            assert "413" not in operation["responses"]
            assert "idempotency_key_reused" in operation["responses"]["422"]["description"]


# -- STORE-11/12: the session status ---------------------------------------------------------
def test_session_status_is_a_closed_vocabulary_stored_as_served() -> None:
    world = make_world(seed=False)
    sid = world.new_session("owner")

    def status() -> tuple[str, str]:
        served = world.call("owner", "GET", f"/v1/sessions/{sid}").json()["data"]["status"]
        _, stored = world.run(world.memory.store.read, reserved("sessions", sid))
        return served, stored["status"]

    assert status() == ("idle", "idle")
    world.call("owner", "POST", f"/v1/sessions/{sid}/turns",
               {"messages": [{"role": "user", "content": "hi"}]})
    assert status() == ("completed", "completed")
    world.call("owner", "POST", f"/v1/sessions/{sid}/stop")
    assert status() == ("stopped", "stopped")
    world.call("owner", "POST", f"/v1/sessions/{sid}/reset")
    assert status() == ("idle", "idle")


def test_a_record_with_the_old_spelling_is_served_in_the_vocabulary() -> None:
    world = make_world()
    for sid, expected in ((world.session_id, "completed"), (world.new_session("owner"), "idle")):
        _, record = world.run(world.memory.store.read, reserved("sessions", sid))
        world.run(world.memory.store.write, reserved("sessions", sid),
                  {**record, "status": "active"})
        world.run(announce, world.memory.store)  # written outside the registry: announced
        served = world.call("owner", "GET", f"/v1/sessions/{sid}").json()["data"]["status"]
        assert served == expected


def test_refusal_codes_seen_so_far(figure: Figure) -> None:
    """Every refusal of this run was checked against the table by ``check_envelope``."""
    figure(f"\nrefusals by code so far: {dict(sorted(REFUSALS.items()))}")
    assert set(REFUSALS) <= set(ERROR_CODES)


_WORLD = make_world()
_JSONISH = st.one_of(
    st.binary(max_size=200),
    st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                 lambda inner: st.lists(inner, max_size=4)
                 | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                 max_leaves=20).map(lambda v: json.dumps(v).encode()))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=_JSONISH, door=st.sampled_from([r for r in ROUTES if r[0] in ("POST", "PUT")]))
def test_any_body_on_any_door_is_answered_never_a_5xx(body: bytes,
                                                      door: tuple[str, str]) -> None:
    """Property (STORE-1, API-7): whatever the bytes, an envelope and never a 5xx; a refusal
    of a malformed or non-finite body is the gate's."""
    method, path = door
    response = _WORLD.client.request(method, _url(path, _WORLD), content=body, headers={
        **_WORLD.headers("admin"), "Content-Type": "application/json"})
    assert response.status_code < 500, response.text
    if not body:
        return  # an absent body reads as {} (API-1): the door's own answer
    try:  # the gate reads UTF-8 only; json.loads alone would also take UTF-16 or a BOM
        document = json.loads(body.decode("utf-8"))
    except ValueError:
        document = None
        assert response.json()["error_code"].startswith("body_")
    if isinstance(document, str | int | float | bool) or (body.strip() == b"null"):
        assert response.json()["error_code"] in ("body_not_container", "body_bad_number")
