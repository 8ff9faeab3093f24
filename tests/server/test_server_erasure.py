"""``DELETE /v1/users/{id}``: a user erased from the service (admin only).

Her user scope, the session she owns (transcript, session memory, viewer links),
her viewer link to another's session and her name in its viewer list, her tokens,
the writer record naming her, the idempotency records of all of it: gone, and a
scan of the whole SQLite file finds her nowhere. The receipt counts, never shows
content; a second erasure counts zero; a dry run deletes nothing; one audit line
and the ``flowmem_erased_items_total`` counter say what went.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from erasure_scan import sqlite_findings
from flowmem.metrics import Metrics
from flowmem.server import Settings
from server_support import USERS, World, make_world

ALICE = USERS["owner"]  # owns the seeded session, bob views it
CANARY = "CANARY-erasure-content"


def _world(tmp_path: Path) -> tuple[World, str]:
    path = str(tmp_path / "erase.db")
    world = make_world(f"sqlite:///{path}", settings=Settings(rate_limit=0.0),
                       metrics=Metrics())
    world.tokens["alice-w"] = world.token_for(ALICE, grants=["workflow:wf:write"])
    return world, path


def _populate(world: World) -> str:
    """Alice's memory, session memory, a view of carol's session, a shared value she wrote
    (with retry keys); returns carol's session id."""
    def ok(role: str, method: str, path: str, body: Any = None, **extra: Any) -> Any:
        response = world.call(role, method, path, body, **extra)
        assert response.status_code in (200, 201), response.text
        return response.json()["data"]

    sid = world.session_id
    ok("owner", "POST", "/v1/memory/append", {"scope": "user", "key": "chat",
                                               "messages": [{"role": "user",
                                                             "content": CANARY}]})
    ok("owner", "POST", "/v1/memory/write", {"scope": "session", "key": "notes", "value": CANARY,
                                              "session_id": sid})
    world.client.post(f"/v1/sessions/{sid}/turns", json={"messages": [
        {"role": "user", "content": CANARY}]},
        headers={**world.headers("owner"), "Idempotency-Key": "retry-1"})
    ok("alice-w", "POST", "/v1/memory/write", {"scope": "workflow", "key": "shared", "value": 1,
                                                "context": {"workflow_id": "wf"}})
    carol = world.new_session("other", "carol's")
    ok("other", "POST", f"/v1/sessions/{carol}/viewers", {"user_id": ALICE})
    return carol


def _samples(world: World) -> dict[str, float]:
    text = world.call("admin", "GET", "/metrics").text
    return {s.labels["kind"]: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == "flowmem_erased_items_total"}


def test_an_admin_erases_a_user_everywhere(tmp_path: Path,
                                           caplog: pytest.LogCaptureFixture) -> None:
    world, path = _world(tmp_path)
    carol = _populate(world)
    dry = world.call("admin", "DELETE", f"/v1/users/{ALICE}", params={"dry_run": "true"})
    assert dry.status_code == 200, dry.text
    assert dry.json()["data"]["dry_run"] is True
    assert world.call("owner", "GET", "/v1/whoami").status_code == 200  # nothing deleted
    with caplog.at_level(logging.INFO, logger="flowmem"):
        response = world.call("admin", "DELETE", f"/v1/users/{ALICE}")
    assert response.status_code == 200, response.text
    receipt = response.json()["data"]
    assert CANARY not in response.text
    assert receipt["user_id"] == ALICE and receipt["dry_run"] is False
    assert receipt["counts"] == dry.json()["data"]["counts"]
    counts = receipt["counts"]
    assert counts["sessions"] == 1 and counts["tokens"] == 2 and counts["writer_records"] == 1
    assert counts["viewer_links"] == 2  # bob's link to her session, hers to carol's
    assert counts["conversations"] >= 2 and counts["values"] == 1
    assert counts["idempotency_records"] >= 1
    assert receipt["total"] == sum(counts.values())
    audit = [r.getMessage() for r in caplog.records if "audit" in r.getMessage()]
    assert len(audit) == 1 and ALICE in audit[0] and CANARY not in audit[0]
    # what she held is gone; what others hold of it no longer names her
    assert world.call("owner", "GET", "/v1/whoami").status_code == 401
    assert world.call("admin", "GET", f"/v1/sessions/{world.session_id}").status_code == 404
    assert world.call("viewer", "GET", "/v1/sessions",
                      params={"role": "viewer"}).json()["data"] == []
    viewers = world.call("other", "GET", f"/v1/sessions/{carol}").json()["data"]["viewers"]
    assert viewers == []
    world.tokens["reader"] = world.token_for("reader", grants=["workflow:*:read"])
    shared = world.call("reader", "POST", "/v1/memory/read", {
        "scope": "workflow", "key": "shared", "context": {"workflow_id": "wf"}}).json()["data"]
    assert shared["value"] == 1 and shared["written_by"] is None  # the value is not hers alone
    assert sqlite_findings(path, [ALICE, CANARY]) == []
    assert _samples(world)["sessions"] == 1
    again = world.call("admin", "DELETE", f"/v1/users/{ALICE}").json()["data"]
    assert again["total"] == 0  # idempotent


@pytest.mark.parametrize(("role", "status"), [("anonymous", 401), ("owner", 403),
                                              ("viewer", 403)])
def test_only_an_admin_may_erase(tmp_path: Path, role: str, status: int) -> None:
    world, _ = _world(tmp_path)
    response = world.call(role, "DELETE", f"/v1/users/{ALICE}")
    assert response.status_code == status, response.text
    assert world.call("owner", "GET", "/v1/whoami").status_code == 200


def test_an_unusable_user_id_is_refused(tmp_path: Path) -> None:
    world, _ = _world(tmp_path)
    response = world.call("admin", "DELETE", "/v1/users/0")
    assert response.status_code == 400, response.text
