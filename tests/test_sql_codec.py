"""The SQL and Redis stores' body codec: one parse of a whole page reads exactly what a
parse per body reads (NUL, lone surrogates and every JSON shape included)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from flowmem.stores.sql_program import decode, decode_all, encode

_TEXT = st.text(alphabet=st.characters(codec=None, categories=None), max_size=20)
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=12)


@given(st.lists(_VALUES, max_size=8))
def test_a_page_decodes_as_its_bodies_one_by_one(values: list[Any]) -> None:
    texts = [encode(value) for value in values]
    assert decode_all(texts) == [decode(text) for text in texts] == values


def test_an_empty_page_is_empty() -> None:
    assert decode_all([]) == []
