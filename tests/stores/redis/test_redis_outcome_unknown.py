"""A writing script whose answer is lost is OutcomeUnknown, never "nothing was changed".

A TCP proxy in front of the shared Redis forwards the ``EVALSHA`` of an append
and cuts the connection before its answer returns: the script ran, and the
caller learns that the append may have been stored; a retry with the same
idempotency key stores it once."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from backends import REDIS_URL
from cutting_proxy import CommitCutter
from flowmem import ExecutionContext, Memory, OutcomeUnknown, StoreUnavailable


@pytest.fixture
def cut_redis() -> Iterator[tuple[str, CommitCutter]]:
    parts = urlsplit(REDIS_URL)
    cutter = CommitCutter(parts.hostname or "127.0.0.1", parts.port or 6379)
    url = urlunsplit((parts.scheme, f"127.0.0.1:{cutter.port}", parts.path,
                      "cluster=no", ""))
    try:
        yield url, cutter
    finally:
        cutter.close()


def test_a_lost_script_answer_is_outcome_unknown(cut_redis: tuple[str, CommitCutter]) -> None:
    url, cutter = cut_redis
    user = ExecutionContext(user_id=f"u{uuid.uuid4().hex[:12]}")
    with Memory.from_url(url) as memory, Memory.from_url(REDIS_URL) as truth:
        memory.append("user", "chat", {"role": "user", "content": "first"}, context=user)
        cutter.marker, cutter.trigger = b"lost-turn", b"EVALSHA"
        with pytest.raises(OutcomeUnknown, match="may or may not") as raised:
            memory.append("user", "chat", {"role": "user", "content": "lost-turn"},
                          context=user, idempotency_key="t-2")
        assert isinstance(raised.value, StoreUnavailable) and cutter.cut.is_set()
        texts = [m["content"] for m in truth.history("user", "chat", context=user).messages]
        assert texts == ["first", "lost-turn"]  # the script ran
        again = memory.append("user", "chat", {"role": "user", "content": "lost-turn"},
                              context=user, idempotency_key="t-2")
        assert again.replayed
        texts = [m["content"] for m in truth.history("user", "chat", context=user).messages]
        assert texts == ["first", "lost-turn"]
