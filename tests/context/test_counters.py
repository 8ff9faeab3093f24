"""The token counters: the approximate one always, tiktoken's when its encoding is cached.

tiktoken downloads an encoding's file on first use; flowmem never does, so on
a machine without the file the adapter refuses with the reason, and these
tests skip with it.
"""

from __future__ import annotations

import pytest

import flowmem
from flowmem.context import (
    ApproximateCounter,
    TiktokenCounter,
    TokenizerUnavailable,
    approximate,
    tiktoken_unavailable,
)

TURN = [{"role": "user", "content": "What is the weather in Paris today?"},
        {"role": "assistant", "content": "Sunny, 18 degrees."}]


def test_the_approximate_counter_grows_with_the_text_and_the_messages() -> None:
    short = approximate(TURN[:1])
    assert 0 < short < approximate(TURN)
    longer = [{"role": "user", "content": TURN[0]["content"] * 10}]
    assert approximate(longer) > short
    assert isinstance(approximate, ApproximateCounter)


def test_an_uncached_encoding_is_refused_with_its_reason_never_downloaded() -> None:
    reason = tiktoken_unavailable("no_such_encoding")
    assert reason is not None and "no_such_encoding" in reason
    with pytest.raises(TokenizerUnavailable):
        TiktokenCounter("no_such_encoding")


@pytest.mark.skipif(tiktoken_unavailable() is not None, reason=tiktoken_unavailable() or "")
def test_tiktoken_counts_and_budgets_whole_turns() -> None:
    counter = TiktokenCounter()
    assert 0 < counter(TURN[:1]) < counter(TURN)
    history = flowmem.ConversationBuffer(TURN * 20).messages
    fitted = flowmem.context.fit(history, 60, counter=counter, format="openai")
    assert 0 < fitted.tokens <= 60
    assert flowmem.is_sendable(fitted.output)
