"""A page read from a store that gives its messages' JSON text parses them only when they
are first read, and otherwise behaves as the dataclass it is (equality, ``repr``,
``asdict``, ``replace``, pickling, frozenness); the echo of a turn never parses it."""

from __future__ import annotations

import dataclasses
import json
import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowmem.pages import UNPARSED, unparsed
from flowmem.results import HistoryResult
from flowmem.store import HistoryPage
from flowmem.stores._codec import encode

_MESSAGES = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "tool"]),
                                            "content": st.text(max_size=8)}), max_size=5)


def _stored(messages: list[dict[str, Any]]) -> HistoryPage:
    texts = [encode(m) for m in messages]
    return HistoryPage(UNPARSED, list(range(len(texts))), None, len(texts), texts)


@given(_MESSAGES)
def test_an_unparsed_page_reads_as_the_parsed_one(messages: list[dict[str, Any]]) -> None:
    page = _stored(messages)
    parsed = HistoryPage(messages, list(range(len(messages))), None, len(messages))
    assert unparsed(page) is UNPARSED
    assert page == parsed and repr(page) == repr(parsed)
    assert page.messages == messages and unparsed(page) == messages  # parsed once, kept
    assert page.messages is page.messages


def test_the_dataclass_tools_see_the_messages() -> None:
    page = _stored([{"role": "user", "content": "\u00e9 \ud800"}])
    result = HistoryResult.of_page(page, "user", "u1")
    assert unparsed(result) is UNPARSED  # passed on, not parsed
    assert dataclasses.asdict(result)["messages"] == [{"role": "user", "content": "\u00e9 \ud800"}]
    assert dataclasses.replace(result, scope="x").messages == result.messages
    again = pickle.loads(pickle.dumps(_stored([{"role": "user", "content": "p"}])))
    assert again.messages == [{"role": "user", "content": "p"}]
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.messages = []  # type: ignore[misc]
    assert HistoryPage().messages == [] and HistoryResult().messages == []


def test_keeping_the_first_entries_keeps_them_unparsed() -> None:
    page = HistoryResult.of_page(_stored([{"role": "user", "content": str(i)} for i in range(4)]),
                                 "session", "s")
    kept = page.kept(2)
    assert unparsed(kept) is UNPARSED and kept.positions == [0, 1]
    assert [json.loads(t)["content"] for t in kept.encoded or []] == ["0", "1"]
    assert kept.messages == [{"role": "user", "content": "0"}, {"role": "user", "content": "1"}]
    assert page.kept(0).before is None
