"""The Agents SDK's ``EncryptedSession`` over a FlowmemSession: opaque items.

``EncryptedSession(session_id, underlying_session=..., encryption_key=...)``
hands its underlying session Fernet envelopes ``{"__enc__", "v", "kid",
"payload"}``, not Responses items. FlowmemSession stores an item it cannot
interpret (no ``role``, no ``type``, not an item reference) as an opaque
entry: the GR-MEM rules skip it (a rule cannot apply to content it cannot
read: it declares no call, answers none, MEM-1/2/3/10), it comes back
unchanged, and no provider rendering carries it (counted as lost). Each test
follows the SDK's own ``tests/extensions/memory/test_encrypt_session.py``
test it names, with FlowmemSession underneath.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")
pytest.importorskip("cryptography")

from agents import Agent, ModelResponse, Runner, Usage
from agents.extensions.memory.encrypt_session import EncryptedSession
from agents.memory import SessionSettings
from agents.models.interface import Model
from cryptography.fernet import Fernet
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

import flowmem
from flowmem.formats import render
from flowmem.integrations.agents import FlowmemSession

KEY = Fernet.generate_key().decode("ascii")
INVALID: Any = {"__enc__": 1, "v": 1, "kid": "hkdf-v1", "payload": "not-a-valid-token"}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[flowmem.AsyncMemory]:
    opened = flowmem.AsyncMemory.from_url(f"sqlite:///{tmp_path / 'encrypted.db'}")
    yield opened
    asyncio.run(opened.aclose())


@pytest.fixture
def fernet_time(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Freeze Fernet's clock, as the SDK's ``set_fernet_time`` fixture does."""
    now = [1_000]
    monkeypatch.setattr("cryptography.fernet.time.time", lambda: now[0])
    return now


def encrypted(memory: flowmem.AsyncMemory, ttl: int = 600,
              **settings: Any) -> tuple[EncryptedSession, FlowmemSession]:
    underlying = FlowmemSession("enc", memory, session_settings=settings or None)
    return EncryptedSession(session_id="enc", underlying_session=underlying,  # type: ignore[arg-type]
                            encryption_key=KEY, ttl=ttl), underlying


def test_basic_functionality(memory: flowmem.AsyncMemory) -> None:
    """``test_encrypted_session_basic_functionality``: items read back decrypted;
    underneath, the stored items are the envelopes, unchanged."""
    session, underlying = encrypted(memory)

    async def go() -> None:
        items = [user("Hello"), {"role": "assistant", "content": "Hi there!"}]
        await session.add_items(items)
        assert await session.get_items() == items
        stored = await underlying.get_items()
        assert [set(i) for i in stored] == [{"__enc__", "v", "kid", "payload"}] * 2
        assert stored == await underlying.get_items()  # unchanged, read after read

    asyncio.run(go())


def test_pop_item_clear_and_limit(memory: flowmem.AsyncMemory) -> None:
    """``test_encrypted_session_pop_item``, ``test_encrypted_session_clear``,
    ``test_encrypted_session_get_items_limit``."""
    session, _ = encrypted(memory)

    async def go() -> None:
        await session.add_items([user(f"Message {i}") for i in range(5)])
        assert [i["content"] for i in await session.get_items(limit=2)] == \
            ["Message 3", "Message 4"]
        assert (await session.pop_item() or {}).get("content") == "Message 4"
        assert len(await session.get_items()) == 4
        await session.clear_session()
        assert await session.get_items() == [] and await session.pop_item() is None

    asyncio.run(go())


def test_ttl_expiration_and_invalid_envelopes(memory: flowmem.AsyncMemory,
                                              fernet_time: Any) -> None:
    """``test_encrypted_session_ttl_expiration``, ``test_encrypted_session_pop_mixed_
    expired_valid`` and ``test_encrypted_session_get_items_limit_skips_invalid_latest_
    envelope``: expired and unreadable envelopes stay stored and are skipped."""
    session, underlying = encrypted(memory, ttl=2)

    async def go() -> None:
        await session.add_items([user("Old"), {"role": "assistant", "content": "Old reply"}])
        fernet_time[0] = 1_003
        await session.add_items([user("New")])
        await underlying.add_items([INVALID])
        assert [i["content"] for i in await session.get_items()] == ["New"]
        assert [i["content"] for i in await session.get_items(limit=1)] == ["New"]
        assert len(await underlying.get_items()) == 4
        assert (await session.pop_item() or {}).get("content") == "New"
        assert await session.pop_item() is None

    asyncio.run(go())


def test_settings_limit_of_the_underlying_session(memory: flowmem.AsyncMemory) -> None:
    """``test_session_settings_get_items_uses_underlying_limit`` and
    ``test_session_settings_delegated_to_underlying``."""
    session, _ = encrypted(memory, limit=3)
    assert session.session_settings == SessionSettings(limit=3)

    async def go() -> None:
        await session.add_items([user(f"Message {i}") for i in range(5)])
        assert [i["content"] for i in await session.get_items()] == \
            ["Message 2", "Message 3", "Message 4"]

    asyncio.run(go())


class OneReply(Model):
    """The SDK's ``Model`` interface replying with one scripted text per turn."""

    def __init__(self, replies: list[str]) -> None:
        self.replies, self.inputs = replies, []  # type: list[str], list[Any]

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.inputs.append(kwargs.get("input", args[1] if len(args) > 1 else None))
        text = self.replies.pop(0)
        message = ResponseOutputMessage(id="msg_1", type="message", role="assistant",
                                        status="completed", content=[ResponseOutputText(
                                            type="output_text", text=text, annotations=[])])
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def test_with_runner(memory: flowmem.AsyncMemory) -> None:
    """``test_encrypted_session_with_runner``: the second turn's input holds the first."""
    model = OneReply(["San Francisco", "California"])
    agent = Agent(name="test", model=model)
    session, _ = encrypted(memory)

    async def go() -> None:
        first = await Runner.run(agent, "Where is the Golden Gate Bridge?", session=session)
        assert first.final_output == "San Francisco"
        second = await Runner.run(agent, "What state is it in?", session=session)
        assert second.final_output == "California"

    asyncio.run(go())
    assert any("Golden Gate" in str(item) for item in model.inputs[-1])


def test_rules_skip_opaque_entries(memory: flowmem.AsyncMemory) -> None:
    """Opaque entries between readable items: a call still gets healed at the next
    user item, right after its turn (MEM-3); a re-fired output is still dropped
    (MEM-1); the opaque items come back unchanged, in place; a provider rendering
    drops them and counts them."""
    session = FlowmemSession("mixed", memory)
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c2", "output": "ok"}
    call2 = {**call, "call_id": "c2"}
    envelope = {"__enc__": 1, "v": 1, "kid": "k", "payload": "p1"}

    async def go() -> list[Any]:
        await session.add_items([user("a"), call, envelope, call2, output, envelope])
        await session.add_items([output, user("b")])
        items: list[Any] = await session.get_items()
        return items

    items = asyncio.run(go())
    assert [i.get("type") or i.get("role") or "opaque" for i in items] == [
        "user", "function_call", "function_call_output", "opaque", "function_call",
        "function_call_output", "opaque", "user"]
    assert items[2]["call_id"] == "c1" and items[3] == envelope == items[6]
    page = asyncio.run(memory.history("session", "mixed",
                                      context=flowmem.ExecutionContext(session_id="mixed")))
    for target in ("openai", "responses", "anthropic"):
        assert render(page.messages, target).lost == {"opaque item": 2}


def test_malformed_items_are_still_refused(memory: flowmem.AsyncMemory) -> None:
    """Only an item of no kind is opaque: an item with a ``role`` or a ``type`` is
    a Responses item and is validated (all or nothing)."""
    session = FlowmemSession("strict", memory)
    with pytest.raises(flowmem.InvalidMessage, match=r"responses\[1\]"):
        asyncio.run(session.add_items([{"__enc__": 1}, {"role": "wizard", "content": "x"}]))
    assert asyncio.run(session.get_items()) == []
