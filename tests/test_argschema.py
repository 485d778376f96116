"""The gateway's argument validator: jsonschema's verdicts, in work linear in the arguments, on RE2.

jsonschema itself is not linear (``uniqueItems`` on unsortable items compares every pair, recursive
``anyOf`` re-validates per branch, a ``$ref`` cycle never ends) and runs patterns on Python's
backtracking ``re``. Two engines judge here: jsonschema-rs for a schema whose work per value is
bounded when it is compiled, the memo validator for the rest. Every verdict is checked on both and
on jsonschema. Every test that could hang on such an engine is bounded by the memo validator's own
step counter, never by a clock: the worst case for each keyword, about 100 KB of arguments, stays
within a small constant times the number of values in them; for jsonschema-rs the tests assert which
schemas it is given (its work per value is bounded by the schema), and bench/ times both.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
from django.conf import settings as django_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcpgateway import services
from mcpgateway.argschema import (
    FAST,
    FAST_ENUM_SCAN,
    FAST_PATHS,
    FAST_WORK,
    MEMO,
    SchemaUnusable,
    input_schema_problem,
    schema_compile,
)
from mcpgateway.models import Action
from tests.gateway_helpers import register_tools, setup_caller

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from argument_validation import DEFAULTS, KB100, RECURSIVE_ANYOF, WORST_CASES, _branching_tree, _fan_out

CATASTROPHIC = "^(a+)+$"
HOSTILE = "a" * 40 + "b"
UNBOUNDED = {"max_nodes": 10**7, "max_items": 10**7, "max_steps": 10**9}
# Steps per value of the arguments the worst cases below may take (a schema of a handful of nodes).
STEPS_PER_VALUE = 8


def verdict(schema: Any, instance: Any, *, fast: bool = False) -> bool:
    return schema_compile(schema, fast=fast).check(instance, **UNBOUNDED).error is None


def verdicts(schema: Any, instance: Any) -> tuple[bool, bool]:
    """The verdict of the memo validator and of the default choice (jsonschema-rs when it may judge)."""
    return verdict(schema, instance), verdict(schema, instance, fast=True)


def reference(schema: Any, instance: Any) -> bool:
    return bool(jsonschema.validators.validator_for(schema)(schema).is_valid(instance))


def values_in(instance: Any) -> int:
    if isinstance(instance, dict):
        return 1 + sum(1 + values_in(v) for v in instance.values())  # a key counts as a value too
    if isinstance(instance, list):
        return 1 + sum(values_in(v) for v in instance)
    return 1


class _NoBacktracking:
    """Stands in for the ``re`` module of jsonschema's keywords: any call fails the test."""

    def search(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a pattern ran on Python's re")


@pytest.fixture
def no_python_re(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonschema._keywords, "re", _NoBacktracking())
    monkeypatch.setattr(jsonschema._utils, "re", _NoBacktracking())


# What each engine says of the three errors below (the memo validator speaks as jsonschema does).
PATTERN_ERRORS = {
    MEMO: [
        f"'{HOSTILE}' does not match '{CATASTROPHIC}'",
        f"'{'x' * 40}z' does not match any of the regexes: '^(x+)+y$'",
        "'not an integer' is not of type 'integer'",
    ],
    FAST: [
        f'"{HOSTILE}" does not match "{CATASTROPHIC}"',
        f"Additional properties are not allowed ('{'x' * 40}z' was unexpected)",
        '"not an integer" is not of type "integer"',
    ],
}


@pytest.mark.parametrize("engine", [MEMO, FAST])
def test_the_pattern_keywords_never_reach_pythons_re(no_python_re: None, engine: str) -> None:
    schema = {
        "type": "object",
        "properties": {"s": {"type": "string", "pattern": CATASTROPHIC}},
        "patternProperties": {"^(x+)+y$": {"type": "integer"}},
        "additionalProperties": False,
        "propertyNames": {"pattern": "^[a-z(x+)]+$"},
    }
    compiled = schema_compile(schema, fast=engine == FAST)
    assert compiled.engine == engine
    assert compiled.check({"s": "aaaa", "xxxy": 1}, **UNBOUNDED).error is None
    hostile, unexpected, not_integer = PATTERN_ERRORS[engine]
    result = compiled.check({"s": HOSTILE}, **UNBOUNDED)
    assert result.engine == engine
    assert result.error is not None
    assert (result.error.path, result.error.message) == (("s",), hostile)
    error = compiled.check({"x" * 40 + "z": 1}, **UNBOUNDED).error
    assert error is not None
    assert (error.path, error.message) == ((), unexpected)
    error = compiled.check({"xxxy": "not an integer"}, **UNBOUNDED).error
    assert error is not None
    assert (error.path, error.message) == (("xxxy",), not_integer)


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
            {"patternProperties": {"^a{2}$": {}}, "additionalProperties": False},
            {"aa": 1},
            {"b": 1},
            "'b' does not match any of the regexes: '^a{2}$'",
        ),
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
    schema = {"type": "object", **schema}
    assert verdicts(schema, good) == (True, True)
    assert reference(schema, good)
    assert verdicts(schema, bad) == (False, False)
    assert not reference(schema, bad)
    error = schema_compile(schema, fast=False).check(bad, **UNBOUNDED).error
    assert error is not None
    assert error.message == message
    fast = schema_compile(schema).check(bad, **UNBOUNDED)
    assert (fast.engine, fast.error is not None and fast.error.path) == (FAST, error.path)
    assert [e.message for e in jsonschema.validators.validator_for(schema)(schema).iter_errors(bad)] == [message]


D4 = "http://json-schema.org/draft-04/schema#"
D6 = "http://json-schema.org/draft-06/schema#"
D7 = "http://json-schema.org/draft-07/schema#"
D2019 = "https://json-schema.org/draft/2019-09/schema"

# (schema, instances): each keyword, per draft where it differs; the verdicts must be jsonschema's.
TABLE: list[tuple[Any, list[Any]]] = [
    ({"type": "integer"}, [1, 1.0, 1.5, True, "1", None]),
    ({"$schema": D4, "type": "integer"}, [1, 1.0, True]),
    ({"type": ["string", "null"]}, ["a", None, 0, []]),
    ({"type": "number"}, [1, 2.5, True, "x"]),
    ({"enum": [1, "a", [1, {"b": True}], None]}, [1, 1.0, True, "a", [1, {"b": True}], [1.0, {"b": 1}], None, {}]),
    ({"const": {"a": [1, 2]}}, [{"a": [1, 2]}, {"a": [1.0, 2.0]}, {"a": [2, 1]}, {"a": [True, 2]}]),
    ({"const": False}, [False, 0, None]),
    ({"multipleOf": 3}, [9, 9.0, 10, 0, -3]),
    ({"multipleOf": 0.1}, [0.3, 0.35, 1, 10**30]),
    ({"minimum": 2, "maximum": 5}, [1, 2, 5, 5.5, "9"]),
    ({"exclusiveMinimum": 2, "exclusiveMaximum": 5}, [2, 2.1, 4.9, 5]),
    ({"$schema": D4, "minimum": 2, "exclusiveMinimum": True, "maximum": 5, "exclusiveMaximum": True}, [2, 3, 5]),
    ({"$schema": D4, "minimum": 2, "exclusiveMinimum": False}, [2, 1]),
    ({"minLength": 2, "maxLength": 3}, ["a", "ab", "abc", "abcd", "é€", 5]),
    ({"pattern": "^[a-z]+[0-9]?$"}, ["abc", "abc1", "1abc", "", 3]),
    ({"items": {"type": "integer"}}, [[1, 2], [1, "a"], [], "x"]),
    ({"prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False}, [["a", 1], ["a"], ["a", 1, 2], [1]]),
    ({"prefixItems": [{"type": "string"}], "items": {"type": "null"}}, [["a", None, None], ["a", 1]]),
    ({"$schema": D7, "items": [{"type": "string"}], "additionalItems": False}, [["a"], ["a", 1], [2]]),
    ({"$schema": D2019, "items": [{"type": "string"}], "additionalItems": {"type": "integer"}}, [["a", 1], ["a", "b"]]),
    ({"$schema": D7, "items": {"type": "string"}, "additionalItems": False}, [["a", "b"], ["a", 1]]),
    ({"contains": {"type": "string"}}, [[1, "a"], [1, 2], []]),
    ({"contains": {"type": "string"}, "minContains": 2, "maxContains": 3}, [["a"], ["a", "b"], ["a"] * 4, [1] * 5]),
    ({"contains": {"type": "string"}, "minContains": 0}, [[], [1]]),
    ({"$schema": D7, "contains": {"type": "string"}, "minContains": 2}, [["a"], [1]]),
    ({"minItems": 1, "maxItems": 2}, [[], [1], [1, 2, 3]]),
    (
        {"uniqueItems": True},
        [[1, 2], [1, 1.0], [1, True], [0, False], [{"a": 1, "b": 2}, {"b": 2, "a": 1}], [[1], [True]]],
    ),
    ({"uniqueItems": False}, [[1, 1]]),
    (
        {"properties": {"a": {"type": "string"}}, "patternProperties": {"^x": {"type": "integer"}}},
        [{"a": "s", "x1": 1}, {"a": 1}, {"x1": "s"}, {"b": None}],
    ),
    ({"properties": {"a": {}}, "additionalProperties": {"type": "boolean"}}, [{"a": 1, "b": True}, {"b": 1}]),
    ({"patternProperties": {"^x": {}}, "additionalProperties": False}, [{"x": 1}, {"y": 1}]),
    ({"required": ["a", "b"]}, [{"a": 1, "b": 2}, {"a": 1}, []]),
    ({"minProperties": 1, "maxProperties": 2}, [{}, {"a": 1}, {"a": 1, "b": 2, "c": 3}]),
    ({"propertyNames": {"maxLength": 2}}, [{"ab": 1}, {"abc": 1}]),
    ({"dependentRequired": {"a": ["b"]}}, [{"a": 1, "b": 2}, {"a": 1}, {"b": 1}]),
    ({"dependentSchemas": {"a": {"required": ["c"]}}}, [{"a": 1, "c": 1}, {"a": 1}]),
    ({"$schema": D7, "dependencies": {"a": ["b"], "c": {"required": ["d"]}}}, [{"a": 1}, {"c": 1}, {"c": 1, "d": 1}]),
    ({"dependentRequired": {"a": ["b"]}, "$schema": D7}, [{"a": 1}]),  # not a draft 7 keyword: ignored
    ({"allOf": [{"type": "integer"}, {"minimum": 3}]}, [3, 2, "x"]),
    ({"anyOf": [{"type": "integer"}, {"minLength": 3}]}, [1, "abc", "a", 1.5]),
    ({"oneOf": [{"type": "integer"}, {"minimum": 3}]}, [1, 5, 4.5, 2.5]),
    ({"not": {"type": "string"}}, [1, "a"]),
    ({"if": {"type": "integer"}, "then": {"minimum": 3}, "else": {"type": "string"}}, [3, 1, "a", None]),
    ({"$schema": D6, "if": {"type": "integer"}, "then": {"minimum": 3}}, [1]),  # not a draft 6 keyword
    (True, [1, None]),
    (False, [1, None]),
    ({"properties": {"a": True, "b": False}}, [{"a": 1}, {"b": 1}]),
    ({"$defs": {"pos": {"minimum": 0}}, "properties": {"n": {"$ref": "#/$defs/pos"}}}, [{"n": 1}, {"n": -1}]),
    ({"$defs": {"pos": {"minimum": 0}}, "$ref": "#/$defs/pos", "maximum": 5}, [3, 6, -1]),
    ({"$schema": D7, "definitions": {"pos": {"minimum": 0}}, "$ref": "#/definitions/pos", "maximum": 5}, [6, -1]),
    ({"$defs": {"s": {"$anchor": "str", "type": "string"}}, "items": {"$ref": "#str"}}, [["a"], [1]]),
    ({"$schema": D7, "definitions": {"s": {"$id": "#str", "type": "string"}}, "items": {"$ref": "#str"}}, [["a"], [1]]),
    ({"properties": {"a": {"type": "integer"}, "b": {"$ref": "#/properties/a"}}}, [{"b": 1}, {"b": "x"}]),
    (
        {
            "$defs": {"a/b": {"type": "integer"}, "c~d": {"type": "string"}},
            "prefixItems": [{"$ref": "#/$defs/a~1b"}, {"$ref": "#/$defs/c~0d"}],
        },
        [[1, "x"], ["x", 1]],
    ),
    (
        {
            "$defs": {
                "tree": {
                    "type": "object",
                    "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/tree"}}},
                    "required": ["v"],
                }
            },
            "$ref": "#/$defs/tree",
        },
        [{"v": 1, "kids": [{"v": 2, "kids": []}]}, {"v": 1, "kids": [{"kids": []}]}],
    ),
    (
        {"$id": "https://example.com/s", "$defs": {"n": {"type": "integer"}}, "$ref": "https://example.com/s#/$defs/n"},
        [1, "x"],
    ),
    (
        {"type": "string", "format": "email", "title": "t", "description": "d", "default": 1, "examples": [1]},
        ["not an email", 1],
    ),
]


@pytest.mark.parametrize(("schema", "instances"), TABLE, ids=lambda v: json.dumps(v)[:60])
def test_the_verdicts_are_jsonschemas(schema: Any, instances: list[Any]) -> None:
    for instance in instances:
        expected = reference(schema, instance)
        assert verdicts(schema, instance) == (expected, expected), (schema, instance)


# --- a differential test on generated schemas and instances ------------------------------------------------

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.sampled_from([0.0, 1.0, 2.5, -1.5]),
    st.sampled_from([2**53 + 1, 3 * 10**20, -(2**60)]),  # past what jsonschema-rs judges exactly
    st.sampled_from(["", "a", "ab", "abc", "x1", "b"]),
)
INSTANCES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(["a", "b", "x1", "c"]), inner, max_size=3)
    ),
    max_leaves=10,
)
TYPES = st.sampled_from(["null", "boolean", "integer", "number", "string", "array", "object"])
NAMES = st.sampled_from(["a", "b", "x1", "c"])
LEAF_SCHEMAS = st.one_of(
    st.booleans(),
    st.builds(lambda t: {"type": t}, st.one_of(TYPES, st.lists(TYPES, min_size=1, max_size=3, unique=True))),
    st.builds(lambda v: {"enum": v}, st.lists(INSTANCES, min_size=1, max_size=3)),
    st.builds(lambda v: {"const": v}, INSTANCES),
    st.builds(lambda n: {"multipleOf": n}, st.sampled_from([1, 2, 0.5])),
    st.builds(
        lambda k, n: {k: n},
        st.sampled_from(["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]),
        st.integers(-2, 3),
    ),
    st.builds(
        lambda k, n: {k: n},
        st.sampled_from(["minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"]),
        st.integers(0, 3),
    ),
    st.builds(lambda p: {"pattern": p}, st.sampled_from(["^a", "b$", "[0-9]", "^(a|ab)+$"])),
    st.builds(lambda u: {"uniqueItems": u}, st.booleans()),
    st.builds(lambda r: {"required": r}, st.lists(NAMES, max_size=2, unique=True)),
    st.builds(
        lambda d: {"dependentRequired": d}, st.dictionaries(NAMES, st.lists(NAMES, max_size=2, unique=True), max_size=2)
    ),
)


def _compound(inner: Any) -> Any:
    return st.one_of(
        st.builds(lambda a, b: {**a, **b} if isinstance(a, dict) and isinstance(b, dict) else a, inner, inner),
        st.builds(
            lambda k, xs: {k: xs}, st.sampled_from(["allOf", "anyOf", "oneOf"]), st.lists(inner, min_size=1, max_size=3)
        ),
        st.builds(lambda s: {"not": s}, inner),
        st.builds(lambda i, t, e: {"if": i, "then": t, "else": e}, inner, inner, inner),
        st.builds(lambda s: {"items": s}, inner),
        st.builds(lambda p, s: {"prefixItems": p, "items": s}, st.lists(inner, max_size=2), inner),
        st.builds(lambda s, lo: {"contains": s, "minContains": lo}, inner, st.integers(0, 2)),
        st.builds(lambda p: {"properties": p}, st.dictionaries(NAMES, inner, max_size=2)),
        st.builds(
            lambda p, a: {"patternProperties": p, "additionalProperties": a},
            st.dictionaries(st.sampled_from(["^x", "^a"]), inner, max_size=2),
            inner,
        ),
        st.builds(lambda s: {"propertyNames": s}, inner),
        st.builds(lambda d: {"dependentSchemas": d}, st.dictionaries(NAMES, inner, max_size=2)),
    )


SCHEMAS = st.recursive(LEAF_SCHEMAS, _compound, max_leaves=8)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=SCHEMAS, instances=st.lists(INSTANCES, min_size=1, max_size=5))
def test_the_verdicts_are_jsonschemas_on_generated_schemas(schema: Any, instances: list[Any]) -> None:
    if input_schema_problem(schema) is not None:  # what the metaschema refuses (e.g. an empty allOf)
        with pytest.raises(jsonschema.SchemaError):
            jsonschema.Draft202012Validator.check_schema(schema)
        return
    memo, chosen = schema_compile(schema, fast=False), schema_compile(schema)
    for instance in instances:
        expected = reference(schema, instance)
        assert (memo.check(instance, **UNBOUNDED).error is None) == expected, (schema, instance)
        assert (chosen.check(instance, **UNBOUNDED).error is None) == expected, (schema, instance, chosen.engine)


# --- unusable schemas -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        ({"properties": {"a": {"$ref": "#/$defs/missing"}}}, "does not resolve"),
        ({"properties": {"a": {"$ref": "#nowhere"}}}, "does not resolve"),
        ({"properties": {"a": {"$ref": "https://example.com/other.json"}}}, "not local"),
        ({"properties": {"a": {"$ref": "other.json#/x"}}}, "not local"),
        ({"$schema": "http://json-schema.org/draft-03/schema#"}, "$schema"),
        ({"$schema": "https://example.com/my-dialect"}, "$schema"),
        ({"$schema": 7}, "$schema"),
        ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "properties": {"x": {"$ref": "#/$defs/a"}}}, "cycle"),
        (
            {
                "$defs": {
                    "a": {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/b"}]},
                    "b": {"not": {"$ref": "#/$defs/a"}},
                },
                "$ref": "#/$defs/a",
            },
            "cycle",
        ),
        ({"allOf": [{"$ref": "#"}]}, "cycle"),
        ({"if": {"$ref": "#"}, "then": {}}, "cycle"),
        ({"dependentSchemas": {"a": {"$ref": "#"}}}, "cycle"),
        ({"properties": {"s": {"pattern": "(a)\\1"}}}, "RE2"),  # a backreference
        ({"properties": {"s": {"pattern": "^(?=a)"}}}, "RE2"),  # lookahead
        ({"patternProperties": {"(?<=x)y": {}}}, "RE2"),
        ({"$defs": {"unused": {"pattern": "(?!a)"}}}, "RE2"),
        ({"properties": {"s": {"pattern": "("}}}, "metaschema"),
        ({"properties": {"n": {"minimum": "0"}}}, "metaschema"),
        ({"type": "integr"}, "metaschema"),
        ({"unevaluatedProperties": False}, "unevaluatedProperties"),
        ({"unevaluatedItems": {"type": "string"}}, "unevaluatedItems"),
        ({"$dynamicRef": "#meta"}, "$dynamicRef"),
        ({"$schema": D2019, "$recursiveRef": "#"}, "$recursiveRef"),
        ({"$defs": {"x": {"$id": "https://example.com/x", "type": "string"}}}, "$id"),
        ([], "not an object"),
    ],
    ids=lambda v: json.dumps(v)[:50],
)
def test_a_schema_the_gateway_cannot_use_is_unusable_with_the_reason(schema: Any, reason: str) -> None:
    with pytest.raises(SchemaUnusable, match=None) as raised:
        schema_compile(schema)
    assert reason in str(raised.value)
    assert input_schema_problem(schema) == str(raised.value)


def test_a_recursive_ref_that_descends_into_the_arguments_is_usable() -> None:
    schema = {"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"}
    assert input_schema_problem(schema) is None
    deep: dict[str, Any] = {}
    for _ in range(60):
        deep = {"next": deep}
    assert verdict(schema, deep) is True
    assert verdict(schema, {"next": {"next": 1}}) is False


# --- worst cases: work linear in the arguments ------------------------------------------------------------
# The cases live with their benchmark (bench/argument_validation.py), which times them.


# The worst cases the memo validator judges (recursive schemas, uniqueItems, large fan-out or mixed enums, a
# fractional multipleOf); jsonschema-rs judges the others, whose work per value the schema bounds.
MEMO_CASES = {
    "uniqueItems": "uniqueItems",
    "uniqueItems objects": "uniqueItems",
    "uniqueItems nested": "recursive",
    "uniqueItems colliding": "uniqueItems",
    "enum (65 mixed)": "enum of more than",
    "multipleOf": "multipleOf that is not an integer",
    "anyOf (recursive)": "recursive",
    "oneOf (recursive)": "recursive",
    "not (recursive)": "recursive",
    "if/then/else (recursive)": "recursive",
    "allOf fan-out (more than 256 paths)": f"more than {FAST_PATHS} schema paths",
}
# Worst cases whose schema jsonschema-rs may judge, but not 100 KB of arguments: paths * values > FAST_WORK.
MEMO_CALLS = {"allOf fan-out (256 paths)"}
# Steps per value the memo validator may take on each worst case: a handful, times the schema paths to a value.
STEPS_PER_VALUE_OF = {
    "allOf fan-out (256 paths)": STEPS_PER_VALUE * 256,
    "allOf fan-out (more than 256 paths)": STEPS_PER_VALUE * 290,
}


@pytest.mark.parametrize("keyword", list(WORST_CASES))
def test_the_worst_case_of_each_keyword_takes_steps_linear_in_the_arguments(keyword: str) -> None:
    schema, instance = WORST_CASES[keyword]
    size = len(json.dumps(instance))
    assert KB100 * 0.45 < size <= KB100, size
    compiled = schema_compile(schema, fast=False)
    result = compiled.check(instance, **UNBOUNDED)
    allowed = STEPS_PER_VALUE_OF.get(keyword, STEPS_PER_VALUE) * values_in(instance)
    assert result.steps <= allowed, (result.steps, values_in(instance))


@pytest.mark.parametrize("keyword", list(WORST_CASES))
def test_each_worst_case_goes_to_the_engine_that_bounds_it(keyword: str) -> None:
    """jsonschema-rs only where its work per value is bounded by the schema; the memo validator (its step
    budget) for the rest, with the reason. Both answer the same."""
    schema, instance = WORST_CASES[keyword]
    compiled = schema_compile(schema)
    if keyword in MEMO_CASES:
        assert compiled.engine == MEMO
        assert MEMO_CASES[keyword] in compiled.why_memo, compiled.why_memo
    else:
        assert (compiled.engine, compiled.why_memo) == (FAST, "")
    chosen = compiled.check(instance, **UNBOUNDED)
    memo = schema_compile(schema, fast=False).check(instance, **UNBOUNDED)
    assert chosen.engine == (MEMO if keyword in MEMO_CALLS else compiled.engine)
    assert (chosen.error is None) == (memo.error is None)
    if chosen.error is not None and memo.error is not None:
        assert chosen.error.path == memo.error.path


def test_the_exponential_cases_stay_exponential_in_jsonschema_but_not_here() -> None:
    """The recursion the memo removes: jsonschema descends more than 3**9 times into a 9-deep chain."""
    counted = {"n": 0}
    original = jsonschema.Draft202012Validator.descend

    def descend(self: Any, *args: Any, **kwargs: Any) -> Any:
        counted["n"] += 1
        yield from original(self, *args, **kwargs)

    chain = [_branching_tree(9)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jsonschema.Draft202012Validator, "descend", descend)
        assert reference(RECURSIVE_ANYOF, chain) is True
    assert counted["n"] > 3**9
    assert schema_compile(RECURSIVE_ANYOF).check(chain, **UNBOUNDED).steps < 200


# --- bounds ----------------------------------------------------------------------------------------------


def test_the_bounds_refuse_before_validating_and_the_budget_while_validating() -> None:
    compiled = schema_compile({"type": "object", "properties": {"xs": {"items": {"uniqueItems": True}}}})
    arguments = {"xs": [[i, i + 1] for i in range(100)]}  # 301 values
    assert compiled.check(arguments, max_nodes=400, max_items=100, max_steps=10_000).error is None

    error = compiled.check(arguments, max_nodes=300, max_items=100, max_steps=10_000).error
    assert error is not None
    assert error.type == "arguments_too_large"
    assert error.message == "The arguments hold more than 300 values."

    error = compiled.check(arguments, max_nodes=400, max_items=99, max_steps=10_000).error
    assert error is not None
    assert error.type == "arguments_too_large"
    assert (error.path, error.message) == (("xs",), "More than 99 items.")

    error = compiled.check({f"k{i}": 0 for i in range(10)}, max_nodes=400, max_items=9, max_steps=10_000).error
    assert error is not None
    assert error.message == "More than 9 properties."

    error = compiled.check(arguments, max_nodes=400, max_items=100, max_steps=100).error
    assert error is not None
    assert error.type == "arguments_too_complex"


# --- the choice of engine -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "instances"),
    [
        ("^\\s$", ["\u00a0", " ", "a"]),  # ECMA-262 (and Rust) \s matches U+00A0; RE2's does not
        ("^\\S$", ["\u00a0", "a"]),
        ("\\bé", ["é", "a é"]),  # Rust's \b is Unicode, RE2's ASCII
        ("^[[:alpha:]]$", ["a", "1"]),
    ],
)
def test_a_pattern_the_regex_engines_read_differently_stays_on_re2(pattern: str, instances: list[str]) -> None:
    schema = {"items": {"pattern": pattern}}
    compiled = schema_compile(schema)
    assert compiled.engine == MEMO
    assert "read differently" in compiled.why_memo
    for instance in instances:
        assert verdicts(schema, [instance]) == (verdict(schema, [instance]),) * 2


@pytest.mark.parametrize(
    ("schema", "inexact", "valid"),
    [
        ({"multipleOf": 3}, 3 * 10**30 + 1, False),  # jsonschema-rs: a multiple of 3 (as a float)
        ({"multipleOf": 3}, 3 * 10**30, True),
        ({"const": 2**53}, 2**53 + 1, False),
        ({"enum": ["x", 2**60]}, 2**60 + 1, False),
        ({"multipleOf": 3}, -8.333917974525975e17, False),
    ],
)
def test_a_number_jsonschema_rs_cannot_judge_exactly_is_judged_by_the_memo_validator(
    schema: Any, inexact: int | float, valid: bool
) -> None:
    compiled = schema_compile({"items": schema})
    assert compiled.engine == FAST
    result = compiled.check([inexact], **UNBOUNDED)
    assert (result.engine, result.error is None) == (MEMO, valid)
    assert reference({"items": schema}, [inexact]) is valid
    assert compiled.check([2**53, -(2**53)], **UNBOUNDED).engine == FAST
    # without multipleOf, enum or const numbers, jsonschema-rs judges them (its bounds compare exactly)
    bounded = schema_compile({"items": {"maximum": 2**60}})
    result = bounded.check([2**60 + 1], **UNBOUNDED)
    assert (result.engine, result.error is None) == (FAST, False)


def test_a_value_jsonschema_rs_cannot_take_is_judged_by_the_memo_validator() -> None:
    schema = {"properties": {"s": {"minLength": 2}}}
    compiled = schema_compile(schema)
    assert compiled.engine == FAST
    result = compiled.check({"s": "\ud800"}, **UNBOUNDED)  # a lone surrogate: not a Rust string
    assert (result.engine, result.error is not None and result.error.path) == (MEMO, ("s",))
    assert compiled.check({"s": "ab"}, **UNBOUNDED).engine == FAST


def test_the_schema_paths_to_one_value_are_counted_through_refs_and_combinators() -> None:
    leaf = {"type": "integer"}
    assert schema_compile({"anyOf": [leaf] * (FAST_PATHS - 1)}).engine == FAST  # the root and 255 paths to leaf
    assert schema_compile({"anyOf": [leaf] * FAST_PATHS}).engine == MEMO

    def through_refs(width: int) -> Any:  # paths: 1 + 1 + width + width + width * 16
        return {"$defs": {"i": {"anyOf": [leaf] * 16}}, "items": {"allOf": [{"$ref": "#/$defs/i"}] * width}}

    assert schema_compile(through_refs(14)).engine == FAST  # 254
    why = schema_compile(through_refs(15)).why_memo  # 272
    assert why == f"more than {FAST_PATHS} schema paths can apply to one value"
    assert schema_compile({"enum": list(range(FAST_ENUM_SCAN))}).engine == FAST
    assert schema_compile({"enum": [str(i) for i in range(10 * FAST_ENUM_SCAN)]}).engine == FAST  # hashed
    assert schema_compile({"enum": [*range(FAST_ENUM_SCAN), None]}).engine == MEMO
    assert schema_compile({"items": {"uniqueItems": False}}).engine == FAST


def test_jsonschema_rs_judges_a_call_only_while_paths_times_values_stay_within_its_work() -> None:
    compiled = schema_compile(_fan_out(15))
    assert (compiled.engine, compiled.paths) == (FAST, FAST_PATHS)
    most = FAST_WORK // FAST_PATHS - 1  # the values of a list: its items and itself
    assert compiled.check(list(range(most)), **UNBOUNDED).engine == FAST
    result = compiled.check([*range(most), -1], **UNBOUNDED)
    assert (result.engine, result.error is not None and result.error.path) == (MEMO, (most,))
    result = compiled.check([*range(most), 1], **DEFAULTS)  # past the step budget: refused, not judged slowly
    assert (result.engine, result.error is not None and result.error.type) == (MEMO, "arguments_too_complex")


def test_jsonschema_rs_cannot_judge_unique_items_in_linear_work() -> None:
    """Why uniqueItems stays on the memo validator: jsonschema-rs hashes an array as its items' hashes in
    turn, so distinct arrays of empty arrays all hash alike (its set then compares every pair)."""
    collide = [[], [[]], [[], []], [[[]]]]
    assert len({json.dumps(c) for c in collide}) == 4
    assert schema_compile({"uniqueItems": True}).engine == MEMO
    assert verdicts({"uniqueItems": True}, collide) == (True, True)
    assert verdicts({"uniqueItems": True}, [*collide, [[]]]) == (False, False)


def test_the_defaults_of_the_benchmark_are_the_settings() -> None:
    assert DEFAULTS == {
        "max_nodes": django_settings.TOOL_ARGUMENT_MAX_NODES,
        "max_items": django_settings.TOOL_ARGUMENT_MAX_ITEMS,
        "max_steps": django_settings.TOOL_ARGUMENT_MAX_STEPS,
    }


# A typical pydantic inputSchema: a model with a list of 5-field items, Optional and enum fields, $defs.
PYDANTIC = {
    "$defs": {
        "Kind": {"enum": ["book", "film", "song"], "title": "Kind", "type": "string"},
        "Item": {
            "properties": {
                "id": {"title": "Id", "type": "integer", "minimum": 0},
                "name": {"title": "Name", "type": "string", "maxLength": 200},
                "kind": {"$ref": "#/$defs/Kind"},
                "price": {"anyOf": [{"type": "number"}, {"type": "null"}], "default": None, "title": "Price"},
                "tags": {"items": {"type": "string"}, "title": "Tags", "type": "array"},
            },
            "required": ["id", "name", "kind"],
            "title": "Item",
            "type": "object",
        },
    },
    "properties": {"items": {"items": {"$ref": "#/$defs/Item"}, "title": "Items", "type": "array"}},
    "required": ["items"],
    "title": "Arguments",
    "type": "object",
}


@pytest.mark.parametrize("fast", [True, False])
def test_a_legitimate_payload_passes_the_default_bounds_on_either_engine(fast: bool) -> None:
    bounds = {
        "max_nodes": django_settings.TOOL_ARGUMENT_MAX_NODES,
        "max_items": django_settings.TOOL_ARGUMENT_MAX_ITEMS,
        "max_steps": django_settings.TOOL_ARGUMENT_MAX_STEPS,
    }
    arguments = {
        "items": [
            {"id": i, "name": f"item {i}", "kind": "book", "price": None if i % 2 else 9.5, "tags": ["a", "b"]}
            for i in range(1000)
        ]
    }
    compiled = schema_compile(PYDANTIC, fast=fast)
    assert compiled.engine == (FAST if fast else MEMO)
    result = compiled.check(arguments, **bounds)
    assert result.error is None, result.error
    assert result.steps <= bounds["max_steps"] // 2  # room to spare on the memo validator
    arguments["items"][999]["kind"] = "game"
    error = compiled.check(arguments, **bounds).error
    assert error is not None
    assert error.path == ("items", 999, "kind")


# --- through the gateway ------------------------------------------------------------------------------------


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


@pytest.mark.django_db
def test_the_worst_unique_items_argument_is_refused_by_the_bounds_and_nothing_is_charged(
    tenant: Any, settings: Any
) -> None:
    """The issue's attack: a set[str] parameter and 8,000 mixed strings and integers. Within the bounds it is
    judged in linear work (invalid: they are not all strings); past them it is refused before validating."""
    register_tools(
        [
            {
                "name": "tags",
                "inputSchema": {
                    "type": "object",
                    "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
                },
            }
        ],
        price="1",
    )
    caller = setup_caller(tenant)
    mixed = [str(i) if i % 2 else i for i in range(8000)]
    r = caller.invoke("tags", {"tags": mixed})
    assert r.status_code == 422, r.content
    assert r.json()["detail"][0]["type"] == "invalid_arguments"
    assert r.json()["detail"][0]["loc"] == ["body", "arguments", "tags", "0"]

    settings.TOOL_ARGUMENT_MAX_ITEMS = 5000
    r = caller.invoke("tags", {"tags": mixed})
    assert r.status_code == 422, r.content
    assert r.json()["detail"] == [
        {"loc": ["body", "arguments", "tags"], "msg": "More than 5000 items.", "type": "arguments_too_large"}
    ]
    settings.TOOL_ARGUMENT_MAX_NODES = 1000
    body = caller.rpc("tags", {"tags": [str(i) for i in range(2000)]}).json()
    assert body["error"]["code"] == -32602, body
    assert body["error"]["data"]["error"] == "arguments_too_large"
    settings.TOOL_ARGUMENT_MAX_NODES = 100_000
    settings.TOOL_ARGUMENT_MAX_STEPS = 50
    r = caller.invoke("tags", {"tags": [str(i) for i in range(2000)]})
    assert r.status_code == 422, r.content
    assert r.json()["detail"][0]["type"] == "arguments_too_complex"
    assert not Action.objects.exists()

    settings.TOOL_ARGUMENT_MAX_STEPS = 100_000
    r = caller.invoke("tags", {"tags": [str(i) for i in range(2000)]})
    assert r.status_code not in (422, 500), r.content  # within every bound and valid: accepted
    assert Action.objects.count() == 1


@pytest.mark.django_db
def test_a_422_judged_by_jsonschema_rs_has_its_path_and_a_short_message(tenant: Any) -> None:
    register_tools(
        [
            {
                "name": "numbers",
                "inputSchema": {"type": "object", "properties": {"xs": {"items": {"type": "integer"}}}},
            }
        ],
        price="1",
    )
    caller = setup_caller(tenant)
    r = caller.invoke("numbers", {"xs": [1, "x" * 10_000]})
    assert r.status_code == 422, r.content
    (detail,) = r.json()["detail"]
    assert detail["loc"] == ["body", "arguments", "xs", "1"]
    assert detail["type"] == "invalid_arguments"
    assert detail["msg"].startswith('"xxx')
    assert detail["msg"].endswith("...")
    assert len(detail["msg"]) <= 3 * 80 + 3
    body = caller.rpc("numbers", {"xs": [1, 2, None]}).json()
    assert body["error"]["code"] == -32602, body
    assert body["error"]["data"]["error"] == "invalid_arguments"
    assert not Action.objects.exists()
