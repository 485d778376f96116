"""Argument validation: the worst case of each inputSchema keyword, in milliseconds per 100 KB of arguments.

    .venv/bin/python bench/argument_validation.py [--rounds 5] [--json PATH]

For every keyword the gateway's validator (``mcpgateway.argschema``) supports, a schema and about
100 KB of arguments built to make it work hardest (``WORST_CASES``, also asserted step by step in
tests/test_argschema.py) are validated ``--rounds`` times on one core; the figure is the best round,
scaled to 100 KB of JSON. The reference is ``json.loads`` of the same arguments, the parse every call
already pays. Imports no Django; needs no database.
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
    "enum": (
        {"items": {"enum": [[1, {"a": 2}], {"b": [3]}, "c", 4.5]}},
        _fill(lambda n: [[1, {"a": 2}] for _ in range(n)]),
    ),
    "const": (
        {"items": {"const": {"a": [1, 2, 3], "b": {"c": None}}}},
        _fill(lambda n: [{"a": [1, 2, 3], "b": {"c": None}} for _ in range(n)]),
    ),
    "type": ({"items": {"type": ["integer", "null"]}}, _fill(lambda n: [1.0] * n)),
    "multipleOf": ({"items": {"multipleOf": 0.01}}, _fill(lambda n: [10**15 + i for i in range(n)])),
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
        text = json.dumps(instance)
        scale = KB100 / len(text)
        verdict = compiled.check(instance, **UNBOUNDED)
        took = best_seconds(lambda c=compiled, i=instance: c.check(i, **UNBOUNDED), args.rounds)
        parse = best_seconds(lambda t=text: json.loads(t), args.rounds)
        cases[keyword] = {
            "bytes": len(text),
            "steps": verdict.steps,
            "valid": verdict.error is None,
            "ms_per_100kb": round(took * scale * 1000, 2),
            "json_loads_ms_per_100kb": round(parse * scale * 1000, 2),
        }
    worst = max(cases, key=lambda k: cases[k]["ms_per_100kb"])
    result = {
        "machine": f"{platform.machine()} python {platform.python_version()}",
        "cases": cases,
        "worst_keyword": worst,
        "worst_ms_per_100kb": cases[worst]["ms_per_100kb"],
        "worst_json_loads_ms_per_100kb": cases[worst]["json_loads_ms_per_100kb"],
    }
    print("| keyword | ms per 100 KB | json.loads ms per 100 KB | steps |\n|---|---|---|---|")
    for keyword, case in cases.items():
        print(f"| {keyword} | {case['ms_per_100kb']} | {case['json_loads_ms_per_100kb']} | {case['steps']:,} |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
