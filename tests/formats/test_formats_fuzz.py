"""Random JSON into every dialect: a refusal is a typed :class:`flowmem.FlowmemError`
(InvalidMessage / InvalidInput), never a ``TypeError`` or a ``KeyError`` — and over
HTTP never a 5xx (the server half is ``tests/server/test_server_formats.py``).

The JSON is biased towards the dialects' own keys and values (``role``, ``type``,
``tool_calls``, ``call_id``...), each holding any JSON at all: the wrong types
where a converter expects a string are the interesting cases (an unhashable
``role`` once answered 500).
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings

from flowmem import formats
from flowmem.errors import InvalidInput
from json_fuzz import TRANSCRIPT


def _converters() -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = [(f"to_canonical({name})",
                                     lambda value, name=name: formats.to_canonical(value, name))
                                    for name in formats.FORMATS]
    found += [("from_openai_chat", formats.from_openai_chat),
              ("from_responses", formats.from_responses),
              ("from_anthropic", formats.from_anthropic)]
    return found


def _only_typed_refusals(value: Any) -> None:
    for name, convert in _converters():
        try:
            convert(value)
        except InvalidInput:
            pass
        except Exception as exc:  # pragma: no cover - the failure this test exists for
            raise AssertionError(f"{name}({value!r}) raised {exc!r}") from exc


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TRANSCRIPT)
def test_every_dialect_refuses_random_json_with_a_typed_error(value: Any) -> None:
    _only_typed_refusals(value)


def test_the_reported_shapes() -> None:
    for value in ([{"type": []}], [{"role": {}, "content": "x"}], [{"role": [], "content": "x"}],
                  {"input": [{"type": {}}]}, {"messages": [{"role": {}}], "system": []}):
        _only_typed_refusals(value)
