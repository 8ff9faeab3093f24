"""FlowmemSession gives back the items it took: the same JSON, field for field.

The SDK's sessions store each item as JSON text (``SQLiteSession`` writes
``json.dumps(item)``), so ``get_items`` returns what ``add_items`` took; the
SDK then compares the tail of the history with what it wrote. flowmem stores
items as canonical entries so the GR-MEM rules apply by call id (MEM-1/2/3/10,
ids read once, MEM-11), and must render them back to the very same items:
content parts with their annotations and logprobs, item references, every
field of every item type. Items are built from the ``openai`` SDK's own
``ResponseInputItemParam`` types.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from openai.types.responses import (
    EasyInputMessageParam,
    ResponseFunctionToolCallParam,
    ResponseInputItemParam,
    ResponseOutputMessageParam,
    ResponseReasoningItemParam,
)
from openai.types.responses.response_input_item_param import (
    ComputerCallOutput,
    FunctionCallOutput,
    ItemReference,
    McpApprovalRequest,
    McpApprovalResponse,
    Message,
)

import flowmem
from flowmem.formats import from_responses, render_responses
from flowmem.integrations.agents import FlowmemSession

CITATION: Any = {"type": "url_citation", "start_index": 0, "end_index": 5,
                 "title": "Paris", "url": "https://example.org/paris"}
LOGPROB: Any = {"token": "Sunny", "bytes": [83, 117], "logprob": -0.25, "top_logprobs": []}

ANSWER_PARTS: EasyInputMessageParam = {  # the case: parts, no id, no status
    "role": "assistant",
    "content": [{"type": "output_text", "text": "Sunny", "annotations": [CITATION],
                 "logprobs": [LOGPROB]},
                {"type": "output_text", "text": "in Paris.", "annotations": []}],
}
TYPED_ANSWER: Any = {"type": "message", "role": "assistant",
                     "content": [{"type": "output_text", "text": "Yes.", "annotations": []},
                                 {"type": "refusal", "refusal": "Not that."}]}
OUTPUT_MESSAGE: ResponseOutputMessageParam = {
    "id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
    "content": [{"type": "output_text", "text": "Done.", "annotations": [CITATION]}]}
OUTPUT_MESSAGE_TEXT: Any = {"id": "msg_2", "type": "message", "role": "assistant",
                            "status": "completed", "content": "Plain."}
USER_PARTS: Message = {
    "type": "message", "role": "user",
    "content": [{"type": "input_text", "text": "Look:"},
                {"type": "input_image", "image_url": "https://example.org/a.png",
                 "detail": "low"},
                {"type": "input_file", "file_id": "file_1", "filename": "a.pdf"}]}
DEVELOPER: EasyInputMessageParam = {"role": "developer", "content": "Be brief.",
                                    "type": "message"}
REFERENCE: ItemReference = {"id": "msg_0"}
TYPED_REFERENCE: ItemReference = {"type": "item_reference", "id": "msg_00"}
REASONING: ResponseReasoningItemParam = {
    "id": "rs_1", "type": "reasoning", "encrypted_content": "gAAA",
    "summary": [{"type": "summary_text", "text": "thinking"}]}
CALL: ResponseFunctionToolCallParam = {"type": "function_call", "call_id": "c1", "id": "fc_1",
                                       "name": "weather", "arguments": '{"city": "Paris"}',
                                       "status": "completed"}
OUTPUT_PARTS: FunctionCallOutput = {
    "type": "function_call_output", "call_id": "c1", "id": "fco_1", "status": "completed",
    "output": [{"type": "input_text", "text": "sunny"},
               {"type": "input_image", "image_url": "https://example.org/sun.png",
                "detail": "auto"}]}
COMPUTER: Any = {"type": "computer_call", "id": "cu_1", "call_id": "k1", "status": "completed",
                 "action": {"type": "click", "button": "left", "x": 1, "y": 2},
                 "pending_safety_checks": []}
COMPUTER_OUTPUT: ComputerCallOutput = {
    "type": "computer_call_output", "call_id": "k1",
    "output": {"type": "computer_screenshot", "image_url": "https://example.org/s.png"}}
APPROVAL: McpApprovalRequest = {"type": "mcp_approval_request", "id": "mcpr_1",
                                "server_label": "deepwiki", "name": "ask",
                                "arguments": "{}"}
APPROVED: McpApprovalResponse = {"type": "mcp_approval_response",
                                 "approval_request_id": "mcpr_1", "approve": True}


def as_json(items: Any) -> str:
    return json.dumps(items, sort_keys=True, ensure_ascii=False)


@pytest.fixture
def memory(tmp_path: Path) -> Any:
    return flowmem.AsyncMemory.from_url(f"sqlite:///{tmp_path / 'fidelity.db'}")


def round_trip(memory: Any, items: list[Any], batches: int = 1) -> list[Any]:
    async def go() -> list[Any]:
        session = FlowmemSession("fidelity", memory)
        size = max(1, len(items) // batches)
        for start in range(0, len(items), size):
            await session.add_items(items[start:start + size])
        got: list[Any] = await session.get_items()
        await memory.aclose()
        return got

    return asyncio.run(go())


def test_assistant_parts_come_back_as_parts(memory: Any) -> None:
    """An assistant message with ``output_text`` parts (annotations, logprobs) and
    no ``id``/``status`` is returned as added, not joined into one string."""
    items: list[ResponseInputItemParam] = [{"role": "user", "content": "Weather?"},
                                           ANSWER_PARTS]
    assert as_json(round_trip(memory, items)) == as_json(items)


def test_item_reference_is_accepted_and_kept(memory: Any) -> None:
    """An untyped item reference ``{"id": ...}`` (``ItemReference``, valid in
    ``ResponseInputItemParam``) is stored and comes back as it was."""
    assert from_responses([REFERENCE])  # refused before: "role must be one of ..."
    items: list[Any] = [{"role": "user", "content": "Go on"}, REFERENCE, TYPED_REFERENCE]
    assert as_json(round_trip(memory, items)) == as_json(items)


@pytest.mark.parametrize("batches", [1, 3, 20])
def test_every_item_type_comes_back_field_for_field(memory: Any, batches: int) -> None:
    """Every item of a long mixed history, in one batch or many, reads back as the
    same JSON (the pairing by ``call_id`` is what the rules use, MEM-11)."""
    items: list[Any] = [DEVELOPER, USER_PARTS, REASONING, TYPED_ANSWER, CALL, OUTPUT_PARTS,
                        OUTPUT_MESSAGE, OUTPUT_MESSAGE_TEXT, {"role": "user", "content": "and?"},
                        COMPUTER, COMPUTER_OUTPUT, APPROVAL, APPROVED, ANSWER_PARTS,
                        REFERENCE, TYPED_REFERENCE]
    assert as_json(round_trip(memory, items, batches)) == as_json(items)


def test_rendered_for_responses_keeps_parts() -> None:
    """The same holds for :func:`flowmem.formats.to_responses` of a stored history:
    nothing the Responses dialect carries is lost (``lost`` is empty)."""
    items: list[Any] = [USER_PARTS, ANSWER_PARTS, TYPED_ANSWER]
    rendered = render_responses(from_responses(items))
    assert as_json(rendered.output) == as_json(items)
    assert rendered.dropped == 0 and rendered.lost == {}
