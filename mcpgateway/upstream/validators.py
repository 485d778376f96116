"""The outputSchema validators the upstream client checks ``structuredContent`` with."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import jsonschema  # type: ignore[import-untyped]  # no stubs in the environment; its package imports the submodules

from common.cache import BoundedCache
from mcpgateway.upstream.http import _describe

VALIDATOR_CACHE_LIMIT: Final = 1024

schema_validators: BoundedCache[tuple[str, str], Any] = BoundedCache(
    "upstream.schema_validators", max_entries=VALIDATOR_CACHE_LIMIT
)
"""The process's one cache of compiled schema validators, keyed by (use, the schema's canonical JSON).

``use`` tells validators built differently for one schema apart: ``"output"`` for the outputSchema
validators here. A value is a compiled validator, or the reason (a string) why the schema is none.
"""


def schema_key(schema: Any) -> str:
    """The schema's canonical JSON (sorted keys, no spaces): what ``schema_validators`` is keyed by."""
    return json.dumps(schema, sort_keys=True, separators=(",", ":"), default=str)


def _output_validator(schema: Mapping[str, Any] | None) -> jsonschema.protocols.Validator | None:
    """A validator for ``schema`` (draft from ``$schema``, else 2020-12); ``ValueError`` if the schema is invalid.

    Checking and compiling a schema costs milliseconds; validators (and the reasons why a schema
    is none) are cached by the schema's canonical JSON (a tool's outputSchema changes only when the
    registry is synced).
    """
    if schema is None:
        return None
    key = ("output", schema_key(schema))
    cached = schema_validators.get(key)
    if isinstance(cached, str):
        raise ValueError(cached)
    if cached is not None:
        return cached
    entry: jsonschema.protocols.Validator | str
    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
        entry = cls(schema)
    except jsonschema.exceptions.SchemaError as exc:
        entry = f"invalid output_schema: {exc.message}"[:300]
    except Exception as exc:  # not a schema at all (a number, a ``$schema`` that is not a string)
        entry = f"invalid output_schema: {_describe(exc)}"
    schema_validators.set(key, entry)
    if isinstance(entry, str):
        raise ValueError(entry)
    return entry


def output_schema_problem(schema: Any) -> str | None:
    """Why ``call_tool`` would refuse ``schema`` as its ``output_schema``; None if it would not.

    ``call_tool`` raises ``ValueError(f"invalid output_schema: {why}")``; this returns ``why``. None
    for no schema. Cheap after the first time for a given schema (cached as the validators are).
    """
    try:
        _output_validator(schema)
    except ValueError as exc:
        return str(exc).removeprefix("invalid output_schema: ")
    return None
