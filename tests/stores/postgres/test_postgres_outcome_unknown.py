"""A change whose answer is lost is OutcomeUnknown, never "nothing was stored".

A TCP proxy between the store and the real server forwards the ``COMMIT`` and
then cuts the connection before its answer reaches the client: the append
*is* stored, and the caller must learn that it may be. The library raises
:class:`flowmem.OutcomeUnknown` (a ``StoreUnavailable``); a retry with the
same idempotency key stores it once; ``flowmem serve`` answers 503
``outcome_unknown`` with ``Retry-After``."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from cutting_proxy import CommitCutter
from flowmem import ExecutionContext, Memory, OutcomeUnknown, StoreUnavailable
from flowmem.server import Settings
from postgres_support import throwaway_schema
from server_support import make_world

ALICE = ExecutionContext(user_id="alice")


@pytest.fixture
def cutter_url() -> Iterator[tuple[str, str, CommitCutter]]:
    with throwaway_schema("outcome") as (url, _schema):
        parts = urlsplit(url)
        cutter = CommitCutter(parts.hostname or "127.0.0.1", parts.port or 5432)
        netloc = parts.netloc.rsplit("@", 1)
        auth = netloc[0] + "@" if len(netloc) == 2 else ""
        proxied = urlunsplit((parts.scheme, f"{auth}127.0.0.1:{cutter.port}", parts.path,
                              parts.query, ""))
        try:
            yield proxied, url, cutter
        finally:
            cutter.close()


def test_a_lost_commit_answer_is_outcome_unknown_and_a_keyed_retry_stores_once(
        cutter_url: tuple[str, str, CommitCutter]) -> None:
    proxied, direct, cutter = cutter_url
    with Memory.from_url(proxied) as memory, Memory.from_url(direct) as truth:
        memory.append("user", "chat", {"role": "user", "content": "first"}, context=ALICE)
        cutter.marker = b"second"
        with pytest.raises(OutcomeUnknown, match="may or may not") as raised:
            memory.append("user", "chat", {"role": "user", "content": "second"},
                          context=ALICE, idempotency_key="turn-2")
        assert isinstance(raised.value, StoreUnavailable) and cutter.cut.is_set()
        # it was stored: the error could not have said "nothing was stored"
        texts = [m["content"] for m in truth.history("user", "chat", context=ALICE).messages]
        assert texts == ["first", "second"]
        again = memory.append("user", "chat", {"role": "user", "content": "second"},
                              context=ALICE, idempotency_key="turn-2")
        assert again.replayed
        texts = [m["content"] for m in truth.history("user", "chat", context=ALICE).messages]
        assert texts == ["first", "second"]  # once


@pytest.mark.server
def test_http_answers_outcome_unknown_with_retry_after(
        cutter_url: tuple[str, str, CommitCutter]) -> None:
    proxied, _direct, cutter = cutter_url
    world = make_world(proxied, Settings(rate_limit=0.0), seed=False)
    body = {"scope": "user", "key": "chat",
            "messages": [{"role": "user", "content": "hello"}]}
    assert world.call("owner", "POST", "/v1/memory/append", body).status_code == 200
    cutter.marker = b"lost-turn"
    headers = {**world.headers("owner"), "Idempotency-Key": "h-1"}
    turn = {**body, "key": "chat2", "messages": [{"role": "user", "content": "lost-turn"}]}
    lost = world.client.post("/v1/memory/append", json=turn, headers=headers)
    assert lost.status_code == 503, lost.text
    assert lost.json()["error_code"] == "outcome_unknown"
    assert lost.headers["Retry-After"] == "1"
    assert "nothing was changed" not in lost.text
    retried = world.client.post("/v1/memory/append", json=turn, headers=headers)
    assert retried.status_code == 200, retried.text
    assert retried.headers.get("Idempotent-Replayed") == "true"
    assert retried.json()["data"]["count"] == 1
