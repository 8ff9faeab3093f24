"""Random JSON biased towards the provider dialects' own keys and values (Hypothesis).

Every key a dialect reads (``role``, ``type``, ``tool_calls``, ``call_id``...)
may hold any JSON at all: the wrong types where a converter expects a string
are the interesting cases.
"""

from __future__ import annotations

from hypothesis import strategies as st

__all__ = ["ITEM", "JSON", "TRANSCRIPT"]

KEYS = ["role", "content", "type", "tool_calls", "tool_call_id", "id", "call_id", "name",
        "arguments", "output", "text", "function", "input", "tool_use_id", "metadata",
        "source", "summary", "refusal", "function_call", "status", "messages", "system",
        "encrypted_content", "signature", "thinking", "cache_control", "is_error"]
WORDS = ["user", "assistant", "system", "tool", "developer", "function", "message",
         "function_call", "function_call_output", "text", "input_text", "output_text",
         "tool_use", "tool_result", "image", "reasoning", "thinking", "redacted_thinking",
         "refusal", "image_url", "c1", "0", ""]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=False),
                    st.sampled_from(WORDS), st.text(max_size=5))
JSON = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)), max_leaves=25)
ITEM = st.one_of(st.dictionaries(st.sampled_from(KEYS), JSON, max_size=6), JSON)
TRANSCRIPT = st.one_of(st.lists(ITEM, max_size=5), JSON)
