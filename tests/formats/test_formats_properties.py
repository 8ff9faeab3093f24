"""Properties of flowmem.formats over generated conversations (Hypothesis).

Conversations with re-fires, interruptions, late results and windows, each
event written in one dialect or a mix (see ``formats_support``), appended
through the real buffer; every rendering must pass the official SDK param
types (strict) and the provider's sequence rules (MEM-5 plus each provider's
own) and lose nothing the target carries; round trips are exact.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from flowmem import ConversationBuffer, formats
from formats_support import DIALECTS, Figures, conversations, read_back, store, transcript

EXAMPLES = int(os.environ.get("FLOWMEM_FORMATS_EXAMPLES", "120"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
FIGURES = Figures()

windows = st.one_of(st.none(), st.integers(2, 12))
dialect_mixes = st.lists(st.sampled_from(DIALECTS), min_size=1, max_size=3)


@pytest.fixture(scope="module", autouse=True)
def _write_figures() -> Iterator[None]:
    yield
    path = os.environ.get("FLOWMEM_FORMATS_FIGURES")
    if path:
        with open(path, "w", encoding="utf-8") as out:
            json.dump({"conversations": FIGURES.conversations,
                       "messages validated": FIGURES.messages,
                       "by target": dict(FIGURES.by_target),
                       "type errors": FIGURES.type_errors,
                       "sequence violations": FIGURES.sequence_violations,
                       "fields lost": FIGURES.fields_lost,
                       "dropped (counted)": FIGURES.dropped}, out, indent=2)


@SETTINGS
@given(conversations(), dialect_mixes, windows)
def test_every_rendering_is_typed_sendable_and_lossless(
        events: list[dict[str, Any]], dialects: list[str], window: int | None) -> None:
    """MEM-5 and each provider's rules hold for any stored history, whatever dialects
    wrote it (MEM-1/2/3/10 applied across dialects by call id, MEM-11)."""
    stored = store(events, dialects, window)
    note(f"stored: {stored}")
    assert FIGURES.record(stored) == []


@SETTINGS
@given(conversations(), dialect_mixes, windows, st.sampled_from(DIALECTS))
def test_round_trip_through_a_dialect_is_exact(
        events: list[dict[str, Any]], dialects: list[str], window: int | None,
        target: str) -> None:
    """from_X(to_X(h)) == h for a sendable history h of dialect X."""
    rendered = formats.render(store(events, dialects, window), target).output
    history = read_back(rendered, target)
    assert formats.render(history, target).output == rendered
    assert read_back(formats.render(history, target).output, target) == history


@SETTINGS
@given(conversations(faults=False), st.sampled_from(DIALECTS))
def test_a_native_sendable_transcript_comes_back_unchanged(
        events: list[dict[str, Any]], dialect: str) -> None:
    """A fault-free transcript written natively in X is stored as is and rendered back
    to exactly itself: thinking signatures, reasoning items, images, ids all kept."""
    native = transcript(events, dialect)
    history = formats.to_canonical(native, dialect)
    buffer = ConversationBuffer()
    assert buffer.append(history).appended == len(history)
    stored = buffer.messages
    assert stored == history
    rendered = formats.render(stored, dialect)
    assert rendered.output == native
    assert rendered.dropped == 0
    assert formats.to_canonical(rendered.output, dialect) == stored
