"""How many examples the Hypothesis tests run: the everyday run's, or more.

``HYPOTHESIS_PROFILE=thorough pytest`` loads the ``thorough`` profile (conftest.py):
five times Hypothesis's default examples for a test that names none, and
:func:`examples` scales the tests that name their own count likewise. The
everyday run keeps each count at what finds the known bugs in a few seconds.
"""

from __future__ import annotations

import os

from hypothesis import settings

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "default")
FACTOR = 5 if PROFILE == "thorough" else 1

# no per-example deadline: on a loaded machine it fails a correct example (a time assertion)
settings.register_profile("default", deadline=None)
settings.register_profile("thorough", max_examples=5 * settings.default.max_examples,
                          deadline=None)


def examples(count: int) -> int:
    """``count`` examples in the everyday run, five times as many under ``thorough``."""
    return count * FACTOR
