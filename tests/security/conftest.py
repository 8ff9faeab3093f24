"""Every attack test: no answer of the service is a 5xx, and its tallies reach the run's summary."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

from attack_support import TALLY


@pytest.fixture(autouse=True)
def _tallied(request: pytest.FixtureRequest) -> Iterator[None]:
    before = Counter(TALLY)
    yield
    mine = Counter(TALLY)
    mine.subtract(before)
    request.node.user_properties.append(("attack", dict(+mine)))
    assert mine["5xx"] == 0, "the service answered 5xx"
