"""The validator of a tool's inputSchema: agents' arguments judged in linear time.

The gateway refuses arguments that break the tool's inputSchema before it accepts or charges the
call (422). Its ``pattern`` and ``patternProperties`` regular expressions come from the upstream,
the strings and property names they are run on from the agent; Python's backtracking ``re`` runs a
pattern such as ``^(a+)+$`` in time exponential in the input, so one agent could hold a worker's
CPU for minutes with a 40-character argument. Here those keywords (and ``additionalProperties``,
which reads ``patternProperties``) run on RE2, which matches in time linear in the input.

RE2 reads the ECMA-262 patterns JSON Schema speaks closely (``\\d``, ``\\w``, ``\\s`` are ASCII, as
there) but has no backreferences or lookaround: a schema with a pattern RE2 cannot compile, or one
that combines ``patternProperties`` with ``unevaluatedProperties`` (whose jsonschema implementation
matches patterns itself), gets no validator, and the upstream judges the arguments, as for any
schema the gateway cannot use.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import lru_cache
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # no stubs in the environment
import re2  # type: ignore[import-untyped]  # no stubs in the environment

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # an unsupported pattern is an answer here, not a line on stderr


@lru_cache(maxsize=1024)
def _compiled(pattern: str) -> Any:
    """The RE2 program of ``pattern``, or None when RE2 cannot compile it."""
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error:
        return None


def _search(pattern: str, text: str) -> bool:
    compiled = _compiled(pattern)
    assert compiled is not None  # arguments_validator admits only schemas whose patterns compile
    return compiled.search(text) is not None


def _pattern(validator: Any, pattern: str, instance: Any, schema: Mapping[str, Any]) -> Iterator[Any]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: Mapping[str, Any], instance: Any, schema: Mapping[str, Any]
) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, additional: Any, instance: Any, schema: Mapping[str, Any]) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = {
        key for key in instance if key not in properties and not any(_search(pattern, key) for pattern in patterns)
    }
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        if patterns:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(repr(each) for each in sorted(extras))
            listed = ", ".join(repr(each) for each in sorted(patterns))
            yield jsonschema.ValidationError(f"{joined} {verb} not match any of the regexes: {listed}")
        else:
            verb = "was" if len(extras) == 1 else "were"
            joined = ", ".join(repr(each) for each in sorted(extras, key=str))
            yield jsonschema.ValidationError(f"Additional properties are not allowed ({joined} {verb} unexpected)")


_LINEAR_KEYWORDS = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
}


def _patterns_supported(schema: Any) -> bool:
    """Whether every ``pattern`` and ``patternProperties`` key in ``schema`` compiles on RE2, and no
    ``unevaluatedProperties`` meets a ``patternProperties`` (a walk over the whole document: a
    property that happens to be named ``pattern`` is checked too, which costs nothing but care)."""
    stack = [schema]
    unevaluated = with_patterns = False
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        pattern = node.get("pattern")
        if isinstance(pattern, str) and _compiled(pattern) is None:
            return False
        pattern_properties = node.get("patternProperties")
        if isinstance(pattern_properties, dict):
            with_patterns = True
            if any(_compiled(key) is None for key in pattern_properties):
                return False
        unevaluated = unevaluated or "unevaluatedProperties" in node
        stack.extend(node.values())
    return not (unevaluated and with_patterns)


def arguments_validator(schema: Any) -> Any:
    """A validator of arguments for the inputSchema ``schema`` (its draft from ``$schema``, the
    pattern keywords on RE2), or None when the gateway cannot use the schema: it is invalid, or its
    patterns need what RE2 lacks. None leaves the arguments to the upstream."""
    try:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)  # else an invalid one (``"minimum": "0"``) raises in the middle of validating
        if not _patterns_supported(schema):
            return None
        linear = jsonschema.validators.extend(cls, _LINEAR_KEYWORDS)
        return linear(schema)
    except Exception:  # an unusable schema from the upstream: let the upstream judge
        return None
