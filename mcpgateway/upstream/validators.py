"""The outputSchema validators the upstream client checks ``structuredContent`` with."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # no stubs in the environment; its package imports the submodules

from mcpgateway.upstream.http import _describe

_validator_cache: dict[str, jsonschema.protocols.Validator | str] = {}
"""Compiled validators, and the reason (a string) for schemas that cannot be one, by canonical JSON."""
_validator_lock = threading.Lock()


def _output_validator(schema: Mapping[str, Any] | None) -> jsonschema.protocols.Validator | None:
    """A validator for ``schema`` (draft from ``$schema``, else 2020-12); ``ValueError`` if the schema is invalid.

    Checking and compiling a schema costs milliseconds; validators (and the reasons why a schema
    is none) are cached by the schema's canonical JSON (a tool's outputSchema changes only when the
    registry is synced).
    """
    if schema is None:
        return None
    fingerprint = json.dumps(schema, sort_keys=True, separators=(",", ":"), default=str)
    cached = _validator_cache.get(fingerprint)
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
    with _validator_lock:
        if len(_validator_cache) > 1024:
            _validator_cache.clear()
        _validator_cache[fingerprint] = entry
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
