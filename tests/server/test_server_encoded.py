"""An answer's page of messages is sent as the store's own JSON text (no decode and
encode again), and reads exactly as the encoded objects would: ASCII only, lone
surrogates and NUL kept, every store alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from flowmem.results import HistoryResult
from flowmem.server._deps import positioned
from flowmem.server._responses import AsciiJSONResponse, Encoded, ascii_json
from flowmem.stores._codec import encode

_TEXT = st.text(alphabet=st.characters(codec=None, categories=None), max_size=12)
_MESSAGES = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]),
                                            "content": _TEXT,
                                            "metadata": st.dictionaries(_TEXT, _TEXT,
                                                                        max_size=2)}),
                     max_size=6)


def _page(messages: list[dict[str, Any]], *, encoded: bool) -> HistoryResult:
    positions = [1024 * (i + 1) for i in range(len(messages))]
    texts = [encode(m) for m in messages] if encoded else None
    return HistoryResult(messages, positions, None, "session", "s", encoded=texts)


def _plain(page: HistoryResult) -> list[dict[str, Any]]:
    return [{"position": p, "message": m} for p, m in zip(page.positions, page.messages,
                                                          strict=True)]


@given(_MESSAGES, _TEXT)
def test_a_spliced_answer_reads_as_the_plain_one(messages: list[dict[str, Any]],
                                                 title: str) -> None:
    page = _page(messages, encoded=True)
    answer = {"success": True, "data": {"title": title, "messages": positioned(page),
                                        "before": None}}
    body = AsciiJSONResponse(answer).body
    assert body.isascii()
    assert json.loads(body) == {"success": True, "data": {
        "title": title, "messages": _plain(page), "before": None}}
    assert body == AsciiJSONResponse({"success": True, "data": {
        "title": title, "messages": _plain(page), "before": None}}).body


def test_a_store_without_texts_is_encoded_plainly() -> None:
    page = _page([{"role": "user", "content": "\ud800 and \x00", "metadata": {}}],
                 encoded=False)
    assert json.loads(ascii_json({"m": positioned(page)})) == {"m": _plain(page)}


def test_a_stored_string_equal_to_the_marker_takes_the_plain_path() -> None:
    """Only a stored string equal to the splice marker could collide with it: then the
    answer is encoded the plain way, and still reads right."""
    marker = "\x00flowmem-encoded-0\x00"
    page = _page([{"role": "user", "content": marker, "metadata": {}}], encoded=True)
    content = {"title": marker, "messages": positioned(page)}
    assert json.loads(ascii_json(content)) == {"title": marker, "messages": _plain(page)}


def test_anything_else_that_is_not_json_is_refused() -> None:
    try:
        ascii_json({"x": object()})
    except TypeError as exc:
        assert "not JSON serializable" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("an object was encoded")
    assert ascii_json(Encoded("[1,2]", lambda: [1, 2])) == "[1,2]"


def test_every_store_gives_the_texts_of_its_page(tmp_path: Path) -> None:
    """SQLite (one aggregated row) gives each body's text, in order, for any page."""
    from flowmem import ExecutionContext, Memory

    memory = Memory.from_url(f"sqlite:///{tmp_path / 'e.db'}")
    context = ExecutionContext(user_id="u")
    for i in range(7):
        memory.append("user", "k", [{"role": "user", "content": f"m{i} \u00e9\ud800"}],
                      context=context)
    for last, before in ((3, None), (None, None), (2, 3 * 1024 ** 2), (10, 1)):
        page = memory.history("user", "k", context=context, last=last, before=before)
        assert page.encoded is not None
        assert [json.loads(t) for t in page.encoded] == page.messages
        assert all(t.isascii() for t in page.encoded)
    memory.close()


def test_remembered_echo_texts_say_what_fresh_ones_say() -> None:
    """The {position, message} texts a turn's echo shares with the last one's are
    remembered: a second echo reads the same, and a long message is never kept."""
    from flowmem.server import _deps as deps

    long = encode({"role": "tool", "tool_call_id": "c", "content": "x" * 2000})
    texts = [encode({"role": "user", "content": f"m{n}"}) for n in range(3)] + [long]
    page = HistoryResult(positions=[4, 5, 6, 7], encoded=texts)
    first, again = positioned(page).text, positioned(page).text
    assert first == again
    assert json.loads(first) == [{"position": p, "message": json.loads(t)}
                                 for p, t in zip(page.positions, texts, strict=True)]
    assert (7, long) not in deps._PAIRS and (4, texts[0]) in deps._PAIRS
