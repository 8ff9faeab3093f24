"""The Redis store's guesses of a buffer's planner view (pure: no server needed).

The guess is never trusted (the ``APPLY`` script checks it; see
tests/test_redis_round_trips.py): these tests pin what it remembers, how it
reads as a :class:`~flowmem.plan.BufferView`, and that it stays bounded.
"""

from __future__ import annotations

import hashlib

from flowmem.plan import BufferView, PendingCall
from flowmem.stores.redis._view_cache import (
    ABSENT,
    CACHED_IDS,
    CACHED_PENDING,
    MAX_ID_CHARS,
    Facts,
    Guess,
    ViewCache,
)

A, B, C = b"{p:a}:meta", b"{p:b}:meta", b"{p:c}:meta"


def test_an_unknown_conversation_is_guessed_empty_and_unlisted() -> None:
    cache = ViewCache()
    assert cache.guess(A, ["c1", "c2"], False) == Guess(("c1", "c2"), (ABSENT, ABSENT),
                                                          None, False)
    assert cache.guess(A, [], True) == Guess((), (), {}, False)


def test_what_an_applied_append_touched_is_remembered() -> None:
    cache = ViewCache()
    guess = Guess(("c1",), (ABSENT,), {}, False)
    # the script: c1 declared and unanswered at 0:0, c2 answered by a placeholder
    cache.learn(A, guess, [b"c1", b"-d", b"0:0", b"c2", b"hd", b""])
    again = cache.guess(A, ["c1", "c2", "c3"], True)
    assert again == Guess(("c1", "c2", "c3"), ("-d", "hd", ABSENT), {"c1": "0:0"}, True)
    assert again.view() == BufferView({"c2": True}, {"c1", "c2"}, [PendingCall("c1", 0, 0)])
    assert again.args() == [3, "c1", "-d", "c2", "hd", "c3", ABSENT, 1, "c1", "0:0", "*"]
    cache.learn(A, again, [b"c1", b"rd", b""])  # answered: no longer unanswered
    assert cache.guess(A, ["c1"], True) == Guess(("c1",), ("rd",), {}, True)


def test_a_conflict_reply_corrects_the_guess() -> None:
    guess = Guess(("c1", "c2"), (ABSENT, ABSENT), {}, True)
    corrected = guess.corrected([b"conflict", b"-d", b"--", [b"c1", b"1048576:0"]])
    assert corrected == Guess(("c1", "c2"), ("-d", ABSENT), {"c1": "1048576:0"}, True)
    no_heal = Guess(("c1",), (ABSENT,), None, False).corrected([b"conflict", b"rd"])
    assert no_heal == Guess(("c1",), ("rd",), None, False)


def test_per_turn_facts_are_guessed_none_and_corrected_from_the_script() -> None:
    """call_ids='per_turn' (MEM-1/2/10): an id's newest answered declaration and its first
    declaring turn travel with the guess; a conflict reply brings the true ones, and the
    newest alias joins the ids whose codes the script checks."""
    facts = Facts.none({"1"}, {"1", "2"})
    guess = Guess(("1", "2"), (ABSENT, ABSENT), {}, True, facts)
    assert guess.view() == BufferView({}, set(), [], {}, {})
    assert guess.args()[-10:] == [1, "1", "", 2, "1", "", "", "2", "", ""]
    body = b'{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]}'
    alias = "1\x1f" + "0" * 12
    reply = [b"conflict", b"rd", b"--", [], [alias.encode(), b"r-", b"4", body, b"", b""]]
    corrected = guess.corrected(reply)
    assert corrected.ids == ("1", "2", alias) and corrected.codes == ("rd", ABSENT, "r-")
    assert corrected.view().newest == {"1": alias}
    assert corrected.view().firsts == {"1": {"role": "assistant", "content": None,
                                             "tool_calls": [{"id": "1"}]}}
    assert corrected.args()[-8:] == [alias, 2, "1", "4", hashlib.sha1(body).hexdigest(),
                                      "2", "", ""]


def test_the_cache_is_bounded() -> None:
    cache = ViewCache(buffers=2)
    empty = Guess((), (), None, False)
    for buffer in (A, B, C):
        cache.learn(buffer, empty, [])
    assert not cache.guess(A, [], False).listed  # the least recently used, forgotten
    assert cache.guess(B, [], False).listed and cache.guess(C, [], False).listed
    many = [f"c{n}" for n in range(CACHED_IDS + 10)]
    flat: list[bytes] = []
    for call in many:
        flat += [call.encode(), b"-d", b""]
    cache.learn(B, empty, flat)
    codes = cache.guess(B, many, False).codes
    assert codes.count("-d") == CACHED_IDS and codes[-1] == "-d"  # the newest kept
    long_id = "x" * (MAX_ID_CHARS + 1)
    cache.learn(B, empty, [long_id.encode(), b"-d", b"0:0"])
    assert cache.guess(B, [long_id], True) == Guess((long_id,), (ABSENT,), {}, True)
    pending: list[bytes] = []
    for n in range(CACHED_PENDING + 1):
        pending += [f"p{n}".encode(), b"-d", b"%d:0" % n]
    cache.learn(C, empty, pending)
    assert cache.guess(C, [], True).pending == {}  # too many to carry
