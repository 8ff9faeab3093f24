"""Schemathesis against ``/openapi.json``, with each kind of valid token and with none.

Positive and negative cases for every operation, with no token (the service
is closed: 401s, documented), as owner, viewer, other user, admin and a
service token with grants. Expected: no 5xx, and every response conforms to
the schema (status code documented, content type, the exact envelope,
headers).
Session ids in paths and bodies are often swapped for the real seeded
session so the success paths are exercised too.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from figures import Figure
from server_support import ROLES, World, make_world

EXAMPLES = 60
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance]


def _aim_at_the_session(case: Any, world: World, flip: bool) -> None:
    """Swap generated session ids for the seeded session (when ``flip``: half the cases)."""
    if not flip:
        return
    if case.path_parameters and "session_id" in case.path_parameters:
        case.path_parameters["session_id"] = world.session_id
    if isinstance(case.body, dict) and "session_id" in case.body:
        case.body["session_id"] = world.session_id


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize("role", [*ROLES, "svc"])
def test_schemathesis(role: str, mode: GenerationMode, figure: Figure) -> None:
    world = make_world()
    world.tokens["svc"] = world.token_for("svc", grants=["workflow:*:write", "global:*:read"])
    schema = schemathesis.openapi.from_asgi("/openapi.json", world.app)
    headers = world.headers(role)
    checks = CHECKS + ([negative_data_rejection] if mode is GenerationMode.NEGATIVE else [])
    tally: Counter[str] = Counter()

    @given(case=schema.as_strategy(mode, headers=headers or None), flip=st.booleans())
    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    def run(case: Any, flip: bool) -> None:
        # a negative case aimed at the real session could become valid: positive only
        _aim_at_the_session(case, world, mode is GenerationMode.POSITIVE and flip)
        response = case.call()
        tally["cases"] += 1
        tally[f"{response.status_code // 100}xx"] += 1
        try:
            case.validate_response(response, checks=checks, headers=headers)
        except Exception:
            tally["violations"] += 1
            raise

    try:
        run()
    finally:
        figure(f"\nschemathesis as {role}, {mode.value}: {dict(sorted(tally.items()))}")

