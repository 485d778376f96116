"""Argument validation: the worst case of each inputSchema keyword, in milliseconds per 100 KB of arguments.

    .venv/bin/python bench/argument_validation.py [--rounds 5] [--json PATH]

For every keyword the gateway's validator (``mcpgateway.argschema``) supports, a schema and about
100 KB of arguments built to make it work hardest (``WORST_CASES``, also asserted step by step in
tests/test_argschema.py) are validated ``--rounds`` times on one core; the figure is the best round,
scaled to 100 KB of JSON. Each case reports the engine the gateway chooses for its schema
(jsonschema-rs or the memo validator), what a request costs with the default bounds (``DEFAULTS``,
the settings' defaults: the validation may stop at a bound and refuse) and the linear constant
without bounds, on the chosen engine and on the memo validator. The reference is ``json.loads`` of
the same arguments, the parse every call already pays. Imports no Django; needs no database.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mcpgateway.argschema import schema_compile  # noqa: E402

CATASTROPHIC = "^(a+)+$"
D7 = "http://json-schema.org/draft-07/schema#"
UNBOUNDED = {"max_nodes": 10**7, "max_items": 10**7, "max_steps": 10**9}
# The defaults of TOOL_ARGUMENT_MAX_NODES, _MAX_ITEMS and _MAX_STEPS (config/settings.py; a test compares them).
DEFAULTS = {"max_nodes": 50_000, "max_items": 10_000, "max_steps": 50_000}

KB100 = 100_000


def _fill(make: Any) -> Any:
    """``make(n)`` with the largest n whose JSON stays within about 100 KB."""
    n = 1
    while len(json.dumps(make(n * 2))) <= KB100:
        n *= 2
    lo, hi = n, n * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if len(json.dumps(make(mid))) <= KB100 else (lo, mid)
    return make(lo)


def _nested(depth: int, leaf: Any, key: str = "a") -> Any:
    value = leaf
    for _ in range(depth):
        value = {key: value}
    return value


def _branching_tree(depth: int) -> Any:
    return _nested(depth, {}, key="a")


def _colliding(n: int) -> list[Any]:
    """``n`` distinct arrays made of empty arrays, smallest first: jsonschema-rs hashes them all alike."""
    forests: list[list[Any]] = [[[]]]  # forests[k]: every list of trees with k nodes in all
    out: list[Any] = []
    size = 0
    while len(out) < n:
        size += 1
        made = []
        for first in range(1, size + 1):  # the first tree holds ``first`` nodes, its inside first - 1
            for inside in forests[first - 1]:
                for rest in forests[size - first]:
                    made.append([inside, *rest])
        forests.append(made)
        out.extend(made)
    return out[:n]


def _fan_out(width: int) -> Any:
    """``width`` * ``width`` schema paths to every item: allOf of ``width`` at two levels."""
    inner = {"allOf": [{"type": "integer", "minimum": -i} for i in range(width)]}
    return {"allOf": [{"items": inner} for _ in range(width)]}


RECURSIVE_ANYOF = {
    "$defs": {
        "n": {
            "anyOf": [
                {"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}}, "required": ["never"]},
                {"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}}, "required": ["nor"]},
                {"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}}},
            ]
        }
    },
    "type": "array",
    "items": {"$ref": "#/$defs/n"},
}

# keyword: (schema, about 100 KB of arguments that make it work hardest)
WORST_CASES: dict[str, tuple[Any, Any]] = {
    # 8,000 mixed strings and integers took jsonschema 15 s of CPU: nothing sorts, every pair is compared.
    "uniqueItems": (
        {"type": "array", "uniqueItems": True},
        _fill(lambda n: [str(i) if i % 2 else i for i in range(n)]),
    ),
    "uniqueItems objects": (
        {"uniqueItems": True},
        _fill(lambda n: [{"k": i, "v": [i, {"x": None}]} for i in range(n)]),
    ),
    "uniqueItems nested": (
        {"$defs": {"u": {"uniqueItems": True, "items": {"$ref": "#/$defs/u"}}}, "$ref": "#/$defs/u"},
        _fill(lambda n: [[[[i, -j - 1]] for j in range(4)] for i in range(n)]),
    ),
    # jsonschema-rs's hash of an array has no length delimiters: distinct arrays of empty arrays collide.
    "uniqueItems colliding": ({"uniqueItems": True}, _fill(_colliding)),
    "enum": (
        {"items": {"enum": [[1, {"a": 2}], {"b": [3]}, "c", 4.5]}},
        _fill(lambda n: [[1, {"a": 2}] for _ in range(n)]),
    ),
    # jsonschema-rs compares a value with each member of an enum that is not all strings, in turn.
    "enum (64 mixed)": (
        {"items": {"enum": [*range(63), [0, {"a": [1, 2]}]]}},
        _fill(lambda n: [[0, {"a": [1, 3]}] for _ in range(n)]),
    ),
    "enum (65 mixed)": (
        {"items": {"enum": [*range(64), [0, {"a": [1, 2]}]]}},
        _fill(lambda n: [[0, {"a": [1, 3]}] for _ in range(n)]),
    ),
    "const": (
        {"items": {"const": {"a": [1, 2, 3], "b": {"c": None}}}},
        _fill(lambda n: [{"a": [1, 2, 3], "b": {"c": None}} for _ in range(n)]),
    ),
    "type": ({"items": {"type": ["integer", "null"]}}, _fill(lambda n: [1.0] * n)),
    "multipleOf": ({"items": {"multipleOf": 0.01}}, _fill(lambda n: [10**15 + i for i in range(n)])),
    "multipleOf (integer)": ({"items": {"multipleOf": 7}}, _fill(lambda n: [7 * (10**12 + i) for i in range(n)])),
    "minimum/maximum": ({"items": {"minimum": 0, "exclusiveMaximum": 10**9}}, _fill(lambda n: [i for i in range(n)])),
    "minLength/maxLength": ({"items": {"minLength": 1, "maxLength": 10**6}}, _fill(lambda n: ["é" * n])),
    "pattern": ({"items": {"pattern": CATASTROPHIC}}, _fill(lambda n: ["a" * n + "b"])),
    "items/prefixItems": (
        {"prefixItems": [{"type": "integer"}] * 50, "items": {"type": "integer"}},
        _fill(lambda n: list(range(n))),
    ),
    "additionalItems": (
        {"$schema": D7, "items": [{}], "additionalItems": {"type": "integer"}},
        _fill(lambda n: list(range(n))),
    ),
    "contains": ({"contains": {"type": "string"}, "minContains": 2, "maxContains": 10**6}, _fill(lambda n: [0] * n)),
    "minItems/maxItems": ({"minItems": 1, "maxItems": 10**6}, _fill(lambda n: [0] * n)),
    "properties": (
        {"properties": {f"p{i}": {"type": "integer"} for i in range(50)}},
        _fill(lambda n: {f"p{i}": i for i in range(n)}),
    ),
    "patternProperties": (
        {"patternProperties": {"^(a+)+$": {"type": "integer"}, "b": {}}, "additionalProperties": False},
        _fill(lambda n: {"a" * (i % 40 + 1) + "b" * (i // 40): i for i in range(n)}),
    ),
    "additionalProperties": (
        {"additionalProperties": {"type": "integer"}},
        _fill(lambda n: {f"k{i}": i for i in range(n)}),
    ),
    "required": ({"items": {"required": ["a", "b", "c"]}}, _fill(lambda n: [{"a": 1, "b": 2, "c": 3}] * n)),
    "minProperties/maxProperties": (
        {"minProperties": 1, "maxProperties": 10**6},
        _fill(lambda n: {f"k{i}": 0 for i in range(n)}),
    ),
    "propertyNames": (
        {"propertyNames": {"pattern": "^(a+)+[0-9]+$"}},
        _fill(lambda n: {"a" * (i % 40 + 1) + str(i): 0 for i in range(n)}),
    ),
    "dependentRequired": (
        {"dependentRequired": {"a": ["b", "c"]}, "additionalProperties": {}},
        _fill(lambda n: {"a": 1, "b": 1, "c": 1, **{f"k{i}": i for i in range(n)}}),
    ),
    "dependentSchemas": (
        {"items": {"dependentSchemas": {"a": {"required": ["b"]}}}},
        _fill(lambda n: [{"a": 1, "b": 2}] * n),
    ),
    "dependencies": (
        {"$schema": D7, "items": {"dependencies": {"a": ["b"], "b": {"required": ["a"]}}}},
        _fill(lambda n: [{"a": 1, "b": 2}] * n),
    ),
    "allOf": (
        {"items": {"allOf": [{"type": "integer"}, {"minimum": 0}, {"maximum": 10**9}]}},
        _fill(lambda n: list(range(n))),
    ),
    "anyOf (recursive)": (RECURSIVE_ANYOF, _fill(lambda n: [_branching_tree(60) for _ in range(n)])),
    "oneOf (recursive)": (
        {
            "$defs": {
                "n": {
                    "oneOf": [
                        {"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}}, "required": ["x"]},
                        {"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}}},
                    ]
                }
            },
            "items": {"$ref": "#/$defs/n"},
        },
        _fill(lambda n: [_branching_tree(60) for _ in range(n)]),
    ),
    "not (recursive)": (
        {
            "$defs": {"n": {"not": {"not": {"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}}}}}},
            "items": {"$ref": "#/$defs/n"},
        },
        _fill(lambda n: [_branching_tree(60) for _ in range(n)]),
    ),
    "if/then/else (recursive)": (
        {
            "$defs": {
                "n": {
                    "if": {"properties": {"a": {"$ref": "#/$defs/n"}}},
                    "then": {"properties": {"a": {"$ref": "#/$defs/n"}}},
                    "else": {"properties": {"a": {"$ref": "#/$defs/n"}}},
                }
            },
            "items": {"$ref": "#/$defs/n"},
        },
        _fill(lambda n: [_branching_tree(60) for _ in range(n)]),
    ),
    "allOf fan-out (256 paths)": (_fan_out(15), _fill(lambda n: list(range(n)))),  # 1 + 15 + 15 + 225
    "allOf fan-out (more than 256 paths)": (_fan_out(16), _fill(lambda n: list(range(n)))),
    "$ref": (
        {"$defs": {"i": {"$ref": "#/$defs/j"}, "j": {"type": "integer"}}, "items": {"$ref": "#/$defs/i"}},
        _fill(lambda n: list(range(n))),
    ),
    "boolean schemas": ({"items": True, "contains": False, "minContains": 0}, _fill(lambda n: [0] * n)),
}


def best_seconds(fn: Any, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    cases: dict[str, dict[str, Any]] = {}
    for keyword, (schema, instance) in WORST_CASES.items():
        compiled = schema_compile(schema)
        memo = schema_compile(schema, fast=False)
        text = json.dumps(instance)
        scale = KB100 / len(text)

        def ms(c: Any, bounds: dict[str, int], i: Any = instance, s: float = scale) -> float:
            return round(best_seconds(lambda: c.check(i, **bounds), args.rounds) * s * 1000, 2)

        bounded = compiled.check(instance, **DEFAULTS)
        cases[keyword] = {
            "bytes": len(text),
            "engine": compiled.engine,
            "default_bounds_verdict": bounded.error.type if bounded.error is not None else "valid",
            "default_bounds_ms_per_100kb": ms(compiled, DEFAULTS),
            "ms_per_100kb": ms(compiled, UNBOUNDED),
            "memo_ms_per_100kb": ms(memo, UNBOUNDED),
            "memo_steps": memo.check(instance, **UNBOUNDED).steps,
            "json_loads_ms_per_100kb": round(best_seconds(lambda t=text: json.loads(t), args.rounds) * scale * 1000, 2),
        }
    worst = max(cases, key=lambda k: cases[k]["default_bounds_ms_per_100kb"])
    result = {
        "machine": f"{platform.machine()} python {platform.python_version()}",
        "default_bounds": DEFAULTS,
        "cases": cases,
        "worst_keyword": worst,
        "worst_default_bounds_ms_per_100kb": cases[worst]["default_bounds_ms_per_100kb"],
        "worst_json_loads_ms_per_100kb": cases[worst]["json_loads_ms_per_100kb"],
    }
    print(
        "| keyword | engine | default bounds: verdict | ms per 100 KB | unbounded ms per 100 KB "
        "| memo validator unbounded ms per 100 KB | memo steps | json.loads ms per 100 KB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for keyword, c in cases.items():
        print(
            f"| {keyword} | {c['engine']} | {c['default_bounds_verdict']} | {c['default_bounds_ms_per_100kb']} "
            f"| {c['ms_per_100kb']} | {c['memo_ms_per_100kb']} | {c['memo_steps']:,} | {c['json_loads_ms_per_100kb']} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
