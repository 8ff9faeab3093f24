"""The PostgreSQL store's own value binding is psycopg's, byte for byte.

Every round trip is one simple-protocol query with its values bound on the
client (flowmem.stores.postgres._binding quotes str, int and None itself, for
CPU). These properties hold it to psycopg's ClientCursor: the same bytes for
any values, the same errors for the values psycopg refuses, and — asked of
the server — every quoted text reads back as itself (no value can end its
literal early: the injection the binding must never allow).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends import unavailable
from postgres_support import admin

REASON = unavailable("postgres")
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

TRICKY = st.sampled_from(["'", "''", "\\", "\\'", "'; DROP TABLE x; --", "E'", "$$", "?",
                          "%s", "%", "--", "/*", "\u00e9", "\U0001f600", "\x00", "\udc80"])
TEXT = st.lists(st.one_of(st.text(max_size=8), TRICKY), max_size=4).map("".join)
VALUE = st.one_of(TEXT, st.integers(), st.none(), st.booleans(),
                  st.floats(allow_nan=True), st.binary(max_size=4))
PROPERTY = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def conn() -> Iterator[Any]:
    with admin() as connection:
        yield connection


def theirs(conn: Any, sql: str, params: list[Any]) -> bytes:
    import psycopg

    text: str = psycopg.ClientCursor(conn).mogrify(sql, params)
    return text.encode("utf-8")


def outcome(call: Any) -> tuple[str, Any]:
    try:
        return "ok", call()
    except Exception as exc:  # the error's type is the promise, not its text
        return "error", type(exc)


@PROPERTY
@given(values=st.lists(VALUE, max_size=5))
def test_values_are_bound_as_psycopg_binds_them(conn: Any, values: list[Any]) -> None:
    from flowmem.stores.postgres._binding import bound
    from flowmem.stores.postgres._common import Begin, query

    statement = "SELECT " + ", ".join(["1 - ?"] * len(values)) if values else "SELECT 1"
    statements = [(statement, tuple(values)), ("COMMIT", ())]
    head = Begin("BEGIN", 1)
    ours = outcome(lambda: bound(conn, statements, head))
    assert ours == outcome(lambda: theirs(conn, *query(statements, head)))


@PROPERTY
@given(text=TEXT)
def test_every_quoted_text_reads_back_as_itself(conn: Any, text: str) -> None:
    from flowmem.stores.postgres._binding import bound

    if "\x00" in text or any(0xD800 <= ord(c) <= 0xDFFF for c in text):
        return  # refused by psycopg, as above
    sql = bound(conn, [("SELECT ?, ?", (text, -1))])
    with conn.cursor() as cur:
        cur.execute(sql)
        assert cur.fetchall() == [(text, -1)]


def test_the_common_values_take_the_fast_path() -> None:
    from flowmem.stores.postgres._binding import literal

    assert literal("it's") == "'it''s'"
    assert literal("a\\b'") == " E'a\\\\b'''"
    assert literal(-5) == " -5"
    assert literal(None) == "NULL"
