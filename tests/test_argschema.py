"""A tool's inputSchema patterns run on RE2: an agent cannot make a backtracking pattern hold a worker.

``^(a+)+$`` against forty ``a`` and a ``b`` takes Python's ``re`` about 2**40 steps; RE2 answers at
once. Each test here would hang rather than fail if the gateway ran such a pattern on ``re``, and
the first checks outright that jsonschema's own ``re`` calls are not reached.
"""

from __future__ import annotations

from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from mcpgateway import services
from mcpgateway.argschema import arguments_validator
from mcpgateway.models import Action
from tests.gateway_helpers import register_tools, setup_caller

CATASTROPHIC = "^(a+)+$"
HOSTILE = "a" * 40 + "b"


class _NoBacktracking:
    """Stands in for the ``re`` module of jsonschema's keywords: any call fails the test."""

    def search(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a pattern ran on Python's re")


@pytest.fixture
def no_python_re(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonschema._keywords, "re", _NoBacktracking())
    monkeypatch.setattr(jsonschema._utils, "re", _NoBacktracking())


def test_the_pattern_keywords_never_reach_pythons_re(no_python_re: None) -> None:
    schema = {
        "type": "object",
        "properties": {"s": {"type": "string", "pattern": CATASTROPHIC}},
        "patternProperties": {"^(x+)+y$": {"type": "integer"}},
        "additionalProperties": False,
        "propertyNames": {"pattern": "^[a-z(x+)]+$"},
    }
    validator = arguments_validator(schema)
    assert validator is not None
    assert validator.is_valid({"s": "aaaa", "xxxy": 1})
    errors = sorted(e.message for e in validator.iter_errors({"s": HOSTILE, "x" * 40 + "z": 1}))
    assert errors == [
        f"'{HOSTILE}' does not match '{CATASTROPHIC}'",
        f"'{'x' * 40}z' does not match any of the regexes: '^(x+)+y$'",
    ]
    assert [e.message for e in validator.iter_errors({"xxxy": "not an integer"})] == [
        "'not an integer' is not of type 'integer'"
    ]


@pytest.mark.parametrize(
    ("schema", "good", "bad", "message"),
    [
        (
            {"properties": {"s": {"pattern": "^\\d{3}$"}}},
            {"s": "123"},
            {"s": "12a"},
            "'12a' does not match '^\\\\d{3}$'",
        ),
        ({"properties": {"s": {"pattern": "é"}}}, {"s": "café"}, {"s": "cafe"}, "'cafe' does not match 'é'"),
        (
            {"properties": {"a": {}}, "additionalProperties": False},
            {"a": 1},
            {"a": 1, "b": 2},
            "Additional properties are not allowed ('b' was unexpected)",
        ),
        (
            {"additionalProperties": {"type": "string"}, "patternProperties": {"^n_": {"type": "integer"}}},
            {"n_1": 1, "other": "x"},
            {"n_1": 1, "other": 2},
            "2 is not of type 'string'",
        ),
        (
            {"$schema": "http://json-schema.org/draft-07/schema#", "properties": {"s": {"pattern": "^a"}}},
            {"s": "ab"},
            {"s": "ba"},
            "'ba' does not match '^a'",
        ),
    ],
)
def test_the_keywords_judge_as_jsonschema_does(schema: dict[str, Any], good: Any, bad: Any, message: str) -> None:
    validator = arguments_validator({"type": "object", **schema})
    reference = jsonschema.validators.validator_for(schema)({"type": "object", **schema})
    assert validator is not None
    assert validator.is_valid(good)
    assert reference.is_valid(good)
    assert [e.message for e in validator.iter_errors(bad)] == [message]
    assert [e.message for e in reference.iter_errors(bad)] == [message]


@pytest.mark.parametrize(
    "schema",
    [
        {"properties": {"s": {"pattern": "(a)\\1"}}},  # a backreference
        {"properties": {"s": {"pattern": "^(?=a)"}}},  # lookahead
        {"patternProperties": {"(?<=x)y": {}}},
        {"patternProperties": {"^a": {}}, "unevaluatedProperties": False},
        {"properties": {"n": {"minimum": "0"}}},  # not a valid schema
    ],
)
def test_a_schema_the_gateway_cannot_run_linearly_is_left_to_the_upstream(schema: dict[str, Any]) -> None:
    assert arguments_validator({"type": "object", **schema}) is None


@pytest.mark.django_db
def test_a_hostile_argument_is_refused_at_once_and_nothing_is_charged(tenant: Any, no_python_re: None) -> None:
    register_tools(
        [
            {
                "name": "fragile",
                "inputSchema": {"type": "object", "properties": {"s": {"type": "string", "pattern": CATASTROPHIC}}},
            }
        ],
        price="1",
    )
    caller = setup_caller(tenant)
    body = caller.rpc("fragile", {"s": HOSTILE}).json()
    assert body["error"]["code"] == -32602, body
    assert body["error"]["data"]["error"] == "invalid_arguments"
    r = caller.invoke("fragile", {"s": HOSTILE})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "arguments", "s"]
    assert not Action.objects.exists()
    assert services.tool_get("fragile") is not None
