"""The type of the ``figure`` fixture (tests/conftest.py): a figure for the run's summary."""

from __future__ import annotations

from collections.abc import Callable

Figure = Callable[[str], None]
