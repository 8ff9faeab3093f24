"""The retention policy, decided in one pure place (flowmem.retention): durations, the
spellings of a policy, what a write sets and when a stored instant has passed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowmem import Memory
from flowmem.errors import InvalidInput
from flowmem.retention import (
    Expiry,
    InvalidRetention,
    Policy,
    Retention,
    expired,
    parse_duration,
    parse_retention,
)


@pytest.mark.parametrize(("text", "seconds"), [
    ("45s", 45), ("15m", 900), ("12h", 43200), ("30d", 2592000), ("2w", 1209600),
    ("90", 90), (" 1.5h ", 5400), (3600, 3600), (0.25, 0.25)])
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "0", "-5s", "3x", "1d2h", "inf", float("nan"), True,
                                 None, 0, -1, "200000w", [30]])
def test_a_bad_duration_is_a_typed_error(bad: object) -> None:
    with pytest.raises(InvalidRetention) as refused:
        parse_duration(bad)
    assert isinstance(refused.value, InvalidInput)


@given(st.integers(1, 5_000), st.sampled_from(["s", "m", "h", "d", "w"]),
       st.booleans())
def test_a_policy_reads_back_as_written(number: int, unit: str, absolute: bool) -> None:
    policy = Policy(parse_duration(f"{number}{unit}"), absolute)
    assert parse_retention({"user": str(policy)}) == Retention({"user": policy})


def test_the_spellings_agree() -> None:
    text = parse_retention("session=30d, user=max_age:365d")
    mapping = parse_retention({"session": 30 * 86400, "user": "max_age:365d"})
    assert text == mapping
    assert str(text) == "session=30d,user=max_age:365d"
    assert parse_retention(None) is None and parse_retention({}) is None


@pytest.mark.parametrize("bad", ["session", "nope=1d", "session=", {"_flowmem": 60},
                                 {"session": "soon"}, 42, ["session=1d"]])
def test_a_bad_policy_is_refused(bad: object) -> None:
    with pytest.raises(InvalidRetention):
        parse_retention(bad)


def test_idle_renews_absolute_does_not_and_refresh_only_when_asked() -> None:
    retention = parse_retention({"session": 60, "user": "max_age:60"})
    assert retention is not None
    assert retention.expiry("session", 1000.0) == Expiry(1000.0, 1060.0, True)
    assert retention.expiry("user", 1000.0) == Expiry(1000.0, 1060.0, False)
    assert retention.expiry("global", 1000.0) is None
    assert retention.refresh("session", 1000.0) is None
    asked = parse_retention({"session": 60, "user": "max_age:60"}, refresh_on_read=True)
    assert asked is not None and asked.refresh("session", 5.0) == Expiry(5.0, 65.0, True)
    assert asked.refresh("user", 5.0) is None  # an absolute age is never moved


def test_an_instant_has_passed_at_it() -> None:
    assert not expired(None, 1e12) and not expired(10.0, 9.999)
    assert expired(10.0, 10.0) and expired(10.0, 11.0)


def test_memory_refuses_a_bad_policy_or_clock_before_opening() -> None:
    with pytest.raises(InvalidRetention):
        Memory.from_url("memory://", retention={"session": "forever"})
    with pytest.raises(InvalidInput):
        Memory.from_url("memory://", clock=42)  # type: ignore[arg-type]


def test_a_store_without_a_sweep_is_refused_a_policy() -> None:
    from flowmem.retention import check_retention

    with pytest.raises(InvalidRetention, match="keeps no expiry"):
        check_retention(object(), parse_retention({"session": 60}))
    check_retention(object(), None)  # no policy: any store
