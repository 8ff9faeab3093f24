"""Issue #9's findings, each attacked through the ASGI app (each failed on the old code).

The live-process findings (idle connections, Host on a real socket, a token
revoked while serving) are ``test_sec_live.py``; the authorization matrix is
``test_sec_matrix.py``. Figures: ``test_sec_zz_figures.py``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from attack_support import attack_world, case, expect, no_deviations
from flowmem.access import Level
from flowmem.cli._main import main
from flowmem.server import Limits, Settings
from flowmem.server._serving import LOOPBACK_HOSTS
from server_support import World

SHARED = [("global", {}), ("workflow", {"workflow_id": "wf-1"}),
          ("pipeline", {"pipeline_id": "p-1"}), ("execution", {"execution_id": "e-1"})]


def _admin_value(world: World, scope: str, context: dict[str, str], key: str) -> Any:
    response = world.call("admin", "POST", "/v1/memory/read",
                          {"scope": scope, "key": key, "context": context})
    return response.json()["data"]["value"]


# 1 -------------------------------------------------------------------------------------------
def test_1_anonymous_callers_cannot_touch_the_shared_scopes() -> None:
    world = attack_world()
    for scope, context in SHARED:
        base = {"scope": scope, "context": context}
        world.call("admin", "POST", "/v1/memory/write", {**base, "key": "v", "value": "signed"})
        world.call("admin", "POST", "/v1/memory/append",
                   {**base, "key": "c", "messages": [{"role": "user", "content": "a"},
                                                     {"role": "user", "content": "b"}]})
        attacks = [("read", {"key": "v"}), ("history", {"key": "c"}),
                   ("write", {"key": "v", "value": "planted"}), ("delete", {"key": "v"}),
                   ("append", {"key": "c", "max_messages": 1,
                               "messages": [{"role": "user", "content": "evict"}]})]
        for op, extra in attacks:
            response = world.call("anonymous", "POST", f"/v1/memory/{op}", {**base, **extra})
            expect(f"#1 anonymous {op} {scope}", response, 401, "unauthenticated")
            case(f"#1 WWW-Authenticate on {op} {scope}",
                 response.headers.get("www-authenticate", "").startswith("Bearer"))
        case(f"#1 {scope} value intact", _admin_value(world, scope, context, "v") == "signed")
        case(f"#1 {scope} conversation intact",
             len(_admin_value(world, scope, context, "c")) == 2)
    no_deviations("#1 ")


def test_1_anonymous_opt_in_is_explicit_and_bounded() -> None:
    reading = attack_world(Settings(anonymous=Level.READ, rate_limit=0.0))
    reading.call("admin", "POST", "/v1/memory/write", {"scope": "global", "key": "k", "value": 1})
    expect("#1o read-only anonymous reads", reading.call(
        "anonymous", "POST", "/v1/memory/read", {"scope": "global", "key": "k"}), 200)
    expect("#1o read-only anonymous writes", reading.call(
        "anonymous", "POST", "/v1/memory/write", {"scope": "global", "key": "k", "value": 2}),
        401, "unauthenticated")
    expect("#1o anonymous never reaches sessions", reading.call(
        "anonymous", "GET", f"/v1/sessions/{reading.session_id}"), 401, "unauthenticated")
    writing = attack_world(Settings(anonymous=Level.WRITE, rate_limit=0.0))
    wrote = writing.call("anonymous", "POST", "/v1/memory/write",
                         {"scope": "global", "key": "k", "value": 2})
    expect("#1o write opt-in writes", wrote, 200)
    read = writing.call("admin", "POST", "/v1/memory/read", {"scope": "global", "key": "k"})
    case("#1o the anonymous writer is recorded", read.json()["data"]["written_by"] == "anonymous")
    no_deviations("#1o ")


# 2 -------------------------------------------------------------------------------------------
def test_2_a_view_grant_never_reaches_the_owners_memory() -> None:
    world = attack_world()
    world.call("owner", "POST", "/v1/memory/write",
               {"scope": "user", "key": "ssn", "value": "SECRET-078-05-1120"})
    world.call("owner", "POST", "/v1/memory/append",
               {"scope": "user", "key": "chat",
                "messages": [{"role": "user", "content": "SECRET-chat"}]})
    sid = world.session_id
    for op, key in (("read", "ssn"), ("history", "chat"), ("read", "chat")):
        for scope in ("user", "session"):
            response = world.call("viewer", "POST", f"/v1/memory/{op}",
                                  {"scope": scope, "key": key, "session_id": sid})
            expect(f"#2 viewer {op} {scope}", response, 403, "forbidden")
            case(f"#2 nothing leaks on {op} {scope}", "SECRET" not in response.text
                 and "alice" not in response.text)
    expect("#2 the viewer still views", world.call("viewer", "GET", f"/v1/sessions/{sid}"), 200)
    no_deviations("#2 ")


# 3 -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("number", [b"1e999", b"-1e999", b"NaN", b"Infinity", b"-Infinity",
                                    b"9" * 5000 + b".0", b"1" + b"0" * 5000])
def test_3_non_finite_numbers_are_400_in_the_envelope(number: bytes) -> None:
    world = attack_world()
    for path, body in (("/v1/memory/read", b'{"scope": "user", "key": "k", "default": %s}'),
                       ("/v1/memory/write", b'{"scope": "user", "key": "k", "value": [%s]}'),
                       (f"/v1/sessions/{world.session_id}/turns",
                        b'{"messages": [{"role": "user", "content": {"x": %s}}]}')):
        response = world.client.post(path, content=body % number, headers={
            **world.headers("owner"), "Content-Type": "application/json"})
        expect(f"#3 {number[:12]!r} on {path}", response, 400, "body_bad_number")
    no_deviations("#3 ")


# 4 -------------------------------------------------------------------------------------------
def test_4_a_stopped_session_refuses_every_write_path() -> None:
    world = attack_world()
    sid = world.session_id
    world.call("owner", "POST", f"/v1/sessions/{sid}/stop")
    message = [{"role": "user", "content": "after stop"}]
    for role in ("owner", "admin"):
        attempts = [
            ("turns", "POST", f"/v1/sessions/{sid}/turns", {"messages": message}),
            ("append", "POST", "/v1/memory/append",
             {"scope": "session", "key": "transcript", "session_id": sid, "messages": message}),
            ("append other key", "POST", "/v1/memory/append",
             {"scope": "session", "key": "notes", "session_id": sid, "messages": message}),
            ("write", "POST", "/v1/memory/write",
             {"scope": "user", "key": "k", "value": 1, "session_id": sid}),
            ("delete", "POST", "/v1/memory/delete",
             {"scope": "session", "key": "notes", "session_id": sid}),
        ]
        for name, method, url, body in attempts:
            expect(f"#4 {role} {name}", world.call(role, method, url, body), 409,
                   "session_stopped")
    page = world.call("owner", "GET", f"/v1/sessions/{sid}/messages").json()
    case("#4 transcript unchanged", page["pagination"]["total"] == 1)
    no_deviations("#4 ")


# 5 -------------------------------------------------------------------------------------------
def test_5_session_messages_are_immutable_below_admin() -> None:
    world = attack_world()
    sid = world.session_id
    more = [{"role": "user", "content": f"m{i}"} for i in range(3)]
    world.call("owner", "POST", f"/v1/sessions/{sid}/turns", {"messages": more})
    transcript = {"scope": "session", "key": "transcript", "session_id": sid}
    attacks = [
        ("evict by turn", "POST", f"/v1/sessions/{sid}/turns",
         {"messages": [{"role": "user", "content": "x"}], "max_messages": 1}),
        ("evict by append", "POST", "/v1/memory/append",
         {**transcript, "messages": [{"role": "user", "content": "x"}], "max_messages": 1}),
        ("delete the transcript", "POST", "/v1/memory/delete", transcript),
        ("overwrite the transcript", "POST", "/v1/memory/write", {**transcript, "value": []}),
        ("edit a message", "PUT", f"/v1/sessions/{sid}/messages/0",
         {"message": {"role": "user", "content": "forged"}}),
        ("delete a message", "DELETE", f"/v1/sessions/{sid}/messages/0", None),
    ]
    for name, method, url, body in attacks:
        expect(f"#5 owner: {name}", world.call("owner", method, url, body), 403,
               "messages_immutable")
    total = world.call("owner", "GET", f"/v1/sessions/{sid}/messages").json()["pagination"]
    case("#5 nothing erased", total["total"] == 4)
    evicted = world.call("admin", "POST", f"/v1/sessions/{sid}/turns",
                         {"messages": [{"role": "user", "content": "y"}], "max_messages": 2})
    expect("#5 admin may evict", evicted, 200)
    expect("#5 the owner still resets (a driving action)",
           world.call("owner", "POST", f"/v1/sessions/{sid}/reset"), 200)
    no_deviations("#5 ")


# 6 -------------------------------------------------------------------------------------------
def test_6_tokens_are_listed_revoked_and_expire(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tokens.db'}"
    cli = CliRunner()
    made = cli.invoke(main, ["token", "create", "--user", "svc", "--grant",
                             "workflow:support-*:write", "--grant", "global:*:read",
                             "--expires", "30d", "--store", url])
    case("#6 create with grants and expiry", made.exit_code == 0, made.output)
    token = made.stdout.strip()
    world = attack_world(store=url, seed=False)
    world.tokens["svc"] = token
    expect("#6 live token works", world.call("svc", "GET", "/v1/whoami"), 200)
    listed = cli.invoke(main, ["token", "list", "--store", url])
    case("#6 list shows the fields", all(h in listed.output for h in (
        "ID", "USER", "ADMIN", "GRANTS", "CREATED", "EXPIRES", "LAST USED")), listed.output)
    case("#6 list shows the grants", "workflow:support-*:write" in listed.output)
    case("#6 list never shows a secret", token not in listed.output and "fm_" not in
         listed.output)
    token_id = world.app.state.flowmem.tokens.token_id(token)
    revoked = cli.invoke(main, ["token", "revoke", token_id, "--store", url])
    case("#6 revoke", revoked.exit_code == 0, revoked.output)
    expect("#6 revoked answers 401 at once", world.call("svc", "GET", "/v1/whoami"), 401,
           "invalid_token")
    again = cli.invoke(main, ["token", "revoke", token_id, "--store", url])
    case("#6 revoking twice fails cleanly", again.exit_code != 0 and "no token" in again.output)
    lifetime = 2.0
    asked_at = time.time()
    world.tokens["brief"] = world.token_for("brief", expires_in=lifetime)
    made_by = time.time()
    before = world.call("brief", "GET", "/v1/whoami")
    if time.time() < asked_at + lifetime:  # under load the call itself may outlive the token
        expect("#6 before expiry", before, 200)
    time.sleep(max(0.0, made_by + lifetime + 0.05 - time.time()))
    expect("#6 expired answers 401", world.call("brief", "GET", "/v1/whoami"), 401,
           "invalid_token")
    world.close()
    no_deviations("#6 ")


# 8 -------------------------------------------------------------------------------------------
def test_8_host_allow_list_and_no_reflecting_redirect() -> None:
    world = attack_world(Settings(allowed_hosts=LOOPBACK_HOSTS, rate_limit=0.0), seed=False)
    for host in ("evil.example", "evil.example:8080", "127.0.0.1.evil.example", "localhost.",
                 "[::2]", ""):
        response = world.client.get("/healthz", headers={"Host": host})
        expect(f"#8 Host {host!r}", response, 400, "host_not_allowed")
    for host in ("localhost", "127.0.0.1:8080", "[::1]:8080", "LOCALHOST"):
        expect(f"#8 Host {host!r} answered", world.client.get(
            "/healthz", headers={"Host": host}), 200)
    slash = world.client.get("/v1/sessions/", headers={**world.headers("owner"),
                                                       "Host": "localhost"},
                             follow_redirects=False)
    expect("#8 trailing slash is not redirected", slash, 404, "route_not_found")
    case("#8 no Location", "location" not in slash.headers)
    no_deviations("#8 ")


# 9 -------------------------------------------------------------------------------------------
def test_9_per_token_rate_limit() -> None:
    world = attack_world(Settings(rate_limit=1.0, burst=5), seed=False)
    answers = [world.call("owner", "GET", "/v1/whoami") for _ in range(8)]
    case("#9 a burst of 5 passes", all(r.status_code == 200 for r in answers[:5]))
    expect("#9 the 6th is limited", answers[5], 429, "rate_limited")
    case("#9 Retry-After", answers[5].headers.get("retry-after", "").isdigit())
    expect("#9 another token has its own bucket", world.call("other", "GET", "/v1/whoami"), 200)
    guesses = [world.client.get("/v1/whoami", headers={"Authorization": f"Bearer fm_guess{i}"})
               for i in range(8)]
    expect("#9 guessing tokens is limited too", guesses[-1], 429, "rate_limited")
    no_deviations("#9 ")


def test_9_stored_bytes_are_capped_including_metadata() -> None:
    world = attack_world()
    big = "x" * 900_000
    for i in range(3):
        response = world.call("admin", "POST", "/v1/memory/write",
                              {"scope": "global", "key": f"new-{i}", "value": "y" * 1_048_576})
        expect(f"#9 1 MiB value {i}", response, 400, "value_too_large")
    url = f"/v1/sessions/{world.session_id}/turns"
    for where, message in (("metadata", {"role": "user", "content": "hi",
                                         "metadata": {"blob": big}}),
                           ("an extra field", {"role": "user", "content": "hi", "blob": big}),
                           ("tool_calls", {"role": "assistant", "content": "", "tool_calls": [
                               {"id": "c", "type": "function",
                                "function": {"name": "f", "arguments": big}}]})):
        expect(f"#9 900 kB in {where}", world.call("owner", "POST", url,
                                                    {"messages": [message]}),
               400, "message_too_large")
        expect(f"#9 900 kB in {where} via memory/append", world.call(
            "owner", "POST", "/v1/memory/append",
            {"scope": "user", "key": "chat", "messages": [message]}), 400, "message_too_large")
    no_deviations("#9 ")


def test_9_a_long_conversation_is_paged_not_read_whole() -> None:
    world = attack_world(Settings(limits=Limits(max_read_bytes=200_000), rate_limit=0.0))
    chunk = [{"role": "user", "content": "z" * 3_000} for _ in range(100)]
    for _ in range(2):
        world.call("owner", "POST", "/v1/memory/append",
                   {"scope": "user", "key": "long", "messages": chunk})
    whole = world.call("owner", "POST", "/v1/memory/read", {"scope": "user", "key": "long"})
    expect("#9 a long conversation read whole", whole, 409, "read_too_large")
    case("#9 the refusal names the history door", "/v1/memory/history" in whole.text)
    page = world.call("owner", "POST", "/v1/memory/history",
                      {"scope": "user", "key": "long", "limit": 10})
    expect("#9 it pages", page, 200)
    case("#9 total counted", page.json()["pagination"]["total"] == 200)
    no_deviations("#9 ")


# 10 ------------------------------------------------------------------------------------------
def test_10_strict_json_types_on_every_field() -> None:
    world = attack_world()
    sid = world.session_id
    history = {"scope": "user", "key": "chat"}
    append = {"scope": "user", "key": "chat", "messages": [{"role": "user", "content": "x"}]}
    bad = [("history last true", "/v1/memory/history", {**history, "last": True}),
           ("history last '5'", "/v1/memory/history", {**history, "last": "5"}),
           ("history limit 1.5", "/v1/memory/history", {**history, "limit": 1.5}),
           ("history before '3'", "/v1/memory/history", {**history, "before": "3"}),
           ("append max_messages true", "/v1/memory/append", {**append, "max_messages": True}),
           ("append max_messages '3'", "/v1/memory/append", {**append, "max_messages": "3"}),
           ("append max_messages 2**64", "/v1/memory/append",
            {**append, "max_messages": 2**64}),
           ("turn max_messages 2**64", f"/v1/sessions/{sid}/turns",
            {"messages": append["messages"], "max_messages": 2**64}),
           ("key 5", "/v1/memory/read", {"scope": "user", "key": 5}),
           ("scope true", "/v1/memory/read", {"scope": True, "key": "k"}),
           ("session title 5", "/v1/sessions", {"title": 5}),
           ("owner_less 'yes'", "/v1/sessions", {"owner_less": "yes"}),
           ("context workflow 7", "/v1/memory/read",
            {"scope": "workflow", "key": "k", "context": {"workflow_id": 7}}),
           ("tool_call_id true", "/v1/memory/append",
            {**append, "messages": [{"role": "tool", "tool_call_id": True}]})]
    for name, url, body in bad:
        expect(f"#10 {name}", world.call("admin", "POST", url, body), 400, "invalid_field")
    no_deviations("#10 ")
