"""Every loss a rendering makes is counted in ``Rendered.lost``, by kind.

``Rendered.dropped`` counts the messages and call declarations the MEM-5
repair removed plus every field, part or item the target cannot carry;
``lost`` breaks the latter down by kind, so a caller can tell what a
provider will not see. Nothing may be dropped silently (a turn removed by
the repair because all it carried was something the target cannot carry
still names that thing) and no kind is listed with a zero count. Messages
are built from the SDKs' own types.
"""

from __future__ import annotations

from typing import Any

import pytest
from anthropic.types import MessageParam
from openai.types.chat import ChatCompletionMessageParam
from openai.types.responses import ResponseInputItemParam

from flowmem.formats import (
    Rendered,
    from_anthropic,
    from_openai_chat,
    from_responses,
    render,
)
from flowmem.normalize import repair_pairing

USER: Any = {"role": "user", "content": "Hi"}
ANNOTATED: ResponseInputItemParam = {
    "role": "assistant",
    "content": [{"type": "output_text", "text": "Sunny.", "logprobs": [
        {"token": "Sunny", "bytes": [83], "logprob": -0.1, "top_logprobs": []}],
        "annotations": [{"type": "url_citation", "start_index": 0, "end_index": 5,
                         "title": "t", "url": "https://example.org"}]}]}
PDF: MessageParam = {"role": "user", "content": [
    {"type": "document", "title": "a.pdf", "context": "the contract",
     "citations": {"enabled": True},
     "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}},
    {"type": "text", "text": "Summarize."}]}


def checked(history: list[Any], target: str) -> Rendered:
    """``history`` rendered for ``target``, with the counting invariants checked."""
    rendered = render(history, target)
    assert all(count > 0 for count in rendered.lost.values()), rendered.lost
    assert rendered.dropped >= sum(rendered.lost.values())
    return rendered


@pytest.mark.parametrize("target", ["openai", "anthropic"])
def test_output_text_annotations_and_logprobs(target: str) -> None:
    lost = checked(from_responses([USER, ANNOTATED]), target).lost
    assert lost == {"output_text.annotations": 1, "output_text.logprobs": 1}


@pytest.mark.parametrize("target", ["openai", "responses"])
def test_pdf_document_context_and_citations(target: str) -> None:
    lost = checked(from_anthropic([PDF]), target).lost
    assert lost == {"document.context": 1, "document.citations": 1}


def test_system_name_to_anthropic() -> None:
    chat: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "Be brief.", "name": "policy"}, USER]
    assert checked(from_openai_chat(chat), "anthropic").lost == {"chat name": 1}


ONLY_REFUSAL: Any = {"role": "assistant", "content": None, "refusal": "I can't."}
ONLY_AUDIO: Any = {"role": "assistant", "content": None, "audio": {"id": "audio_1"}}
REFUSAL_PART: Any = {"role": "assistant", "content": [{"type": "refusal",
                                                       "refusal": "I can't."}]}


@pytest.mark.parametrize(("turn", "target", "kind"), [
    (ONLY_REFUSAL, "anthropic", "chat refusal"), (ONLY_REFUSAL, "responses", "chat refusal"),
    (ONLY_AUDIO, "anthropic", "chat audio"), (ONLY_AUDIO, "responses", "chat audio"),
    (REFUSAL_PART, "anthropic", "refusal part")])
def test_a_turn_dropped_for_what_it_carried_names_it(turn: Any, target: str,
                                                     kind: str) -> None:
    """The MEM-5 repair drops an assistant turn left with nothing the target can
    send; what it carried is counted too, by kind (one drop for the turn)."""
    rendered = checked(from_openai_chat([USER, turn, USER]), target)
    assert rendered.lost == {kind: 1}
    assert rendered.dropped == 2


@pytest.mark.parametrize(("target", "kind"), [("openai", "responses item"),
                                              ("anthropic", "responses items")])
def test_a_turn_of_only_an_item_reference_names_it(target: str, kind: str) -> None:
    rendered = checked(from_responses([USER, {"id": "msg_1"}, USER]), target)
    assert rendered.lost == {kind: 1} and rendered.dropped == 2


def test_a_user_turn_of_only_audio_to_anthropic_names_the_audio() -> None:
    audio: ChatCompletionMessageParam = {"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "UklG", "format": "wav"}}]}
    rendered = checked(from_openai_chat([USER, audio]), "anthropic")
    assert rendered.lost == {"input_audio part": 1, "empty user turn": 1}


def test_no_zero_counts() -> None:
    """Chat text parts on an assistant turn go to Responses as text: nothing lost,
    and no ``'refusal part': 0`` entry."""
    chat: list[ChatCompletionMessageParam] = [
        USER, {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]}]
    rendered = checked(from_openai_chat(chat), "responses")
    assert rendered.lost == {} and rendered.dropped == 0


@pytest.mark.parametrize("target", ["openai", "responses", "anthropic"])
def test_a_kept_turn_is_counted_once(target: str) -> None:
    """A turn the target keeps is not counted again as dropped: its losses appear
    once (the repair removes nothing here)."""
    history = from_responses([USER, ANNOTATED, USER])
    rendered = checked(history, target)
    assert repair_pairing(history)[1] == 0
    assert rendered.dropped == sum(rendered.lost.values())
