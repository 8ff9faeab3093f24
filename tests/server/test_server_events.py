"""``GET /v1/sessions/{id}/events``: the session's changes as server-sent events.

The pure part (:class:`flowmem.service._events.Tail`) is checked with
Hypothesis against a real :class:`flowmem.Memory`: what the events say,
applied to what was seen, is what the store holds; ``appended`` is the sum
of the appends' own MEM-14 figures; a placeholder (MEM-3) and its late
replacement (MEM-10) are told apart by position. The route is checked in
process (authorization as reading the session: absence before denial) and
against a real ``flowmem serve`` (live changes, a revoked viewer's stream
ends, SIGTERM ends open streams instead of waiting for them).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowmem import Memory
from flowmem.metrics import Metrics
from flowmem.scopes import ExecutionContext
from flowmem.service._events import TAIL, Tail, is_late_result
from server_support import flowmem, free_port, make_world, serving

CONTEXT = ExecutionContext(user_id="alice")


def _events(text: str) -> list[tuple[str, Any]]:
    found = []
    for block in text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines()
                     if line and not line.startswith(":") and ": " in line)
        if "event" in lines:
            found.append((lines["event"], json.loads(lines["data"])))
    return found


def _look(memory: Memory) -> tuple[list[int], list[dict[str, Any]], int]:
    page = memory.history("user", "chat", context=CONTEXT, last=TAIL)
    return page.positions, page.messages, page.total or 0


# -- the pure diff, against a real Memory ----------------------------------------------------
ACTIONS = st.lists(st.one_of(
    st.tuples(st.just("user"), st.integers(0, 3)),
    st.tuples(st.just("calls"), st.integers(0, 3)),
    st.tuples(st.just("result"), st.integers(0, 9)),
), min_size=1, max_size=10)  # the whole conversation stays within TAIL


def _messages(action: tuple[str, int], declared: list[str]) -> list[dict[str, Any]]:
    kind, n = action
    if kind == "user":
        return [{"role": "user", "content": f"u{n}"}]
    if kind == "calls":
        ids = [f"c{len(declared) + i}" for i in range(n + 1)]
        declared.extend(ids)
        return [{"role": "assistant", "content": "", "tool_calls": [
            {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}}
            for i in ids]}]
    call = declared[n % len(declared)] if declared else "c0"
    return [{"role": "tool", "tool_call_id": call, "content": f"r{n}"}]


@settings(max_examples=60, deadline=None)
@given(ACTIONS, st.integers(1, 4))
def test_events_replay_to_what_the_store_holds(actions: list[tuple[str, int]],
                                              every: int) -> None:
    """Applying each change to what was seen gives the store's tail; ``appended`` is
    the appends' own MEM-14 sum; MEM-3 placeholders and MEM-10 replacements are named."""
    metrics = Metrics()
    memory = Memory.from_url("memory://", metrics=metrics)
    tail, declared = Tail(), []
    seen: dict[int, dict[str, Any]] = {}
    tail.change(*_look(memory))
    appended = healed_before = replaced_before = 0
    for index, action in enumerate(actions, start=1):
        result = memory.append("user", "chat", _messages(action, declared), context=CONTEXT)
        appended += result.appended
        if index % every and index != len(actions):
            continue
        counters = metrics.snapshot()["counters"]
        healed = counters.get("calls_healed{backend=memory}", 0) - healed_before
        replaced = counters.get("placeholders_replaced{backend=memory}", 0) - replaced_before
        positions, messages, count = _look(memory)
        before = set(seen)
        change = tail.change(positions, messages, count)
        for position in change.removed:
            seen.pop(position, None)
        for item in change.messages:
            seen[item["position"]] = item["message"]
        assert change.count == count
        assert change.appended == appended
        healed_since = sum(1 for p in change.replaced if p not in before)  # and replaced
        assert len(change.healed) == healed - healed_since
        assert len(change.replaced) == replaced
        assert seen == dict(zip(positions, messages, strict=True))  # in one look: new
        for position in change.replaced:
            assert is_late_result(position, seen[position])
        appended = 0
        healed_before += healed
        replaced_before += replaced


def test_a_late_result_is_told_by_its_slot() -> None:
    memory = Memory.from_url("memory://")
    tail = Tail()
    memory.append("user", "chat", [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}],
        context=CONTEXT)
    tail.change(*_look(memory))
    memory.append("user", "chat", {"role": "user", "content": "again"}, context=CONTEXT)
    heal = tail.change(*_look(memory))
    assert (heal.appended, len(heal.healed), heal.replaced) == (1, 1, ())
    memory.append("user", "chat", {"role": "tool", "tool_call_id": "a", "content": "late"},
                  context=CONTEXT)
    late = tail.change(*_look(memory))
    assert (late.appended, late.healed, late.replaced) == (0, (), heal.healed)
    assert late.messages == [{"position": heal.healed[0], "message": {
        "role": "tool", "content": "late", "metadata": {"tool_call_id": "a"}}}]
    assert tail.change(*_look(memory)).empty  # nothing happened since


def test_a_long_conversation_sliding_past_the_window_reports_no_removal() -> None:
    memory = Memory.from_url("memory://")
    tail = Tail()
    for n in range(TAIL + 5):
        memory.append("user", "chat", {"role": "user", "content": str(n)}, context=CONTEXT)
    tail.change(*_look(memory))
    memory.append("user", "chat", [{"role": "user", "content": "a"},
                                   {"role": "user", "content": "b"}], context=CONTEXT)
    change = tail.change(*_look(memory))
    assert (change.appended, change.removed, change.count) == (2, (), TAIL + 7)
    memory.delete("user", "chat", context=CONTEXT)
    gone = tail.change(*_look(memory))
    assert (gone.count, len(gone.removed)) == (0, TAIL)


# -- the route, in process -------------------------------------------------------------------
def test_the_stream_is_authorized_as_reading_the_session() -> None:
    world = make_world()
    path = f"/v1/sessions/{world.session_id}/events"
    for role, status in {"anonymous": 401, "other": 404, "owner": 200, "viewer": 200,
                         "admin": 200}.items():
        response = world.call(role, "GET", path, params={"timeout": 0})
        assert response.status_code == status, (role, response.text)
        if status == 200:
            assert response.headers["content-type"].startswith("text/event-stream")
            events = _events(response.text)
            assert events[0] == ("snapshot", {"count": 1, "newest": 0, "status": "completed"})
            assert events[-1] == ("end", {"reason": "timeout"})
    assert world.call("owner", "GET", "/v1/sessions/" + "f" * 32 + "/events").status_code == 404
    assert world.call("owner", "GET", path, params={"timeout": 0, "x": 1}).status_code == 400


# -- against a real flowmem serve ------------------------------------------------------------
@pytest.fixture
def served(tmp_path: Any) -> Iterator[tuple[httpx.Client, dict[str, str]]]:
    store = f"sqlite:///{tmp_path / 'events.db'}"
    tokens = {user: subprocess.run(flowmem("token", "create", "--user", user, "--store", store),
                                   check=True, capture_output=True, text=True).stdout.strip()
              for user in ("alice", "bob")}
    with serving(store, free_port(), "--rate-limit", "0") as client:
        yield client, tokens


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _listen(client: httpx.Client, path: str, token: str, into: list[tuple[str, Any]],
            opened: threading.Event) -> None:
    with client.stream("GET", path, headers=_auth(token), timeout=30) as response:
        assert response.status_code == 200
        buffer = ""
        for chunk in response.iter_text():
            buffer += chunk
            *blocks, buffer = buffer.split("\n\n")
            for block in blocks:
                into.extend(_events(block + "\n\n"))
                opened.set()


def _wait(events: list[tuple[str, Any]], kind: str, seconds: float = 15) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for event, data in events:
            if event == kind:
                return data
        time.sleep(0.05)
    raise AssertionError(f"no {kind!r} event in {events}")


def test_a_live_stream_follows_turns_and_ends_when_access_is_revoked(
        served: tuple[httpx.Client, dict[str, str]]) -> None:
    client, tokens = served
    alice = _auth(tokens["alice"])
    sid = client.post("/v1/sessions", json={"title": "t"}, headers=alice).json()["data"]["id"]
    client.post(f"/v1/sessions/{sid}/viewers", json={"user_id": "bob"}, headers=alice)
    events: list[tuple[str, Any]] = []
    opened = threading.Event()
    listener = threading.Thread(target=_listen, args=(client, f"/v1/sessions/{sid}/events",
                                                      tokens["bob"], events, opened))
    listener.start()
    assert opened.wait(15)
    turn = client.post(f"/v1/sessions/{sid}/turns", headers=alice, json={"messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})
    change = _wait(events, "change")
    assert (change["appended"], change["count"]) == (turn.json()["data"]["appended"], 2)
    assert [m["message"]["content"] for m in change["messages"]] == ["hi", "hello"]
    client.delete(f"/v1/sessions/{sid}/viewers/bob", headers=alice)
    assert _wait(events, "end") == {"reason": "gone"}
    listener.join(15)
    assert not listener.is_alive()


def test_sigterm_ends_open_streams(tmp_path: Any) -> None:
    store = f"sqlite:///{tmp_path / 'stop.db'}"
    token = subprocess.run(flowmem("token", "create", "--user", "alice", "--store", store),
                           check=True, capture_output=True, text=True).stdout.strip()
    events: list[tuple[str, Any]] = []
    opened = threading.Event()
    port = free_port()
    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as own, \
            serving(store, port) as client:  # own outlives the service
        sid = client.post("/v1/sessions", json={}, headers=_auth(token)).json()["data"]["id"]
        listener = threading.Thread(target=_listen, args=(
            own, f"/v1/sessions/{sid}/events", token, events, opened))
        listener.start()
        assert opened.wait(15)
        stopping = time.monotonic()
    # serving() sent SIGTERM and saw a graceful exit, with the stream open until then
    listener.join(15)
    assert events[-1] == ("end", {"reason": "shutdown"})
    assert time.monotonic() - stopping < 10  # not the stream's own 300 s lifetime
