"""The SQL and Redis stores' body codec: one parse of a whole page reads exactly what a
parse per body reads (NUL, lone surrogates and every JSON shape included)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from flowmem.stores._codec import decode, decode_all, encode
from flowmem.stores.sqlite._programs import oldest_first

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


@given(st.lists(st.integers(min_value=0, max_value=10**9), unique=True, max_size=30),
       st.randoms(use_true_random=False))
def test_a_sqlite_page_pairs_positions_and_bodies_whatever_the_aggregate_order(
        positions: list[int], rng: Any) -> None:
    """SQLite before 3.44 does not promise the order an aggregate sees its rows in; the
    page read (one row, two aggregates of the SAME pass) must pair them in any order."""
    bodies = [{"at": p} for p in positions]
    shuffled = list(zip(positions, bodies, strict=True))
    rng.shuffle(shuffled)
    got_positions, got_bodies = oldest_first([p for p, _ in shuffled], [b for _, b in shuffled])
    assert got_positions == sorted(positions)
    assert got_bodies == [{"at": p} for p in sorted(positions)]
