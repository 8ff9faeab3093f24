"""The attack suite's figures (runs last in this folder): requests, cases, deviations, 5xx."""

from __future__ import annotations

from attack_support import DEVIATIONS, TALLY


def test_attack_suite_figures() -> None:
    print(f"\nattack suite: {TALLY['requests']} requests, {TALLY['cases']} cases, "
          f"{TALLY['deviations']} deviations, {TALLY['5xx']} 5xx")
    assert TALLY["deviations"] == 0, DEVIATIONS[:20]
    assert TALLY["5xx"] == 0
