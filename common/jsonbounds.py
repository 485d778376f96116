"""The bounds a JSON value must keep to be stored, signed and read back unchanged; no Django here.

Request bodies (``common.jsonbody``) and upstream answers (``mcpgateway.upstream``) are read
through ``loads_bounded`` and their strings held to ``unstorable``:

* nesting: at most ``MAX_JSON_DEPTH`` levels of arrays and objects (``json_too_deep``);
* numbers: no ``NaN`` or ``Infinity``, nothing that overflows to infinity (``1e400``), no integer
  outside the range every JSON implementation reads exactly, ``±(2**53 - 1)``
  (``number_out_of_range``): RFC 8785 cannot write them, PostgreSQL cannot store the first two;
* strings, object keys included: no NUL (PostgreSQL text and jsonb cannot hold it) and no lone
  surrogate (not UTF-8, so neither stored nor canonicalized by RFC 8785).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

MAX_JSON_DEPTH = 64
MAX_SAFE_INTEGER = 2**53 - 1
_SURROGATE = re.compile("[\ud800-\udfff]")


class JSONBodyError(ValueError):
    """JSON outside the bounds above; ``type`` is the error type a 422 names."""

    def __init__(self, message: str, type_: str) -> None:
        super().__init__(message)
        self.type = type_


def _reject_constant(name: str) -> Any:
    raise JSONBodyError(f"{name} is not a number this service accepts.", "number_out_of_range")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JSONBodyError(f"The number {text[:40]} is out of range.", "number_out_of_range")
    return value


def _safe_int(text: str) -> int:
    if len(text) > 17:  # longer than any integer in range: refuse before converting
        raise JSONBodyError("An integer is out of the range ±(2**53 - 1).", "number_out_of_range")
    value = int(text)
    if abs(value) > MAX_SAFE_INTEGER:
        raise JSONBodyError("An integer is out of the range ±(2**53 - 1).", "number_out_of_range")
    return value


def _check_depth(value: Any) -> None:
    """``json_too_deep`` when ``value`` nests arrays and objects more than ``MAX_JSON_DEPTH`` levels deep
    (level by level, holding only the containers)."""
    level: list[Any] = [value]
    depth = 1
    while level:
        below: list[Any] = []
        for item in level:
            kind = type(item)
            if kind is dict:
                children: Any = item.values()
            elif kind is list:
                children = item
            else:
                continue
            if depth > MAX_JSON_DEPTH:
                raise JSONBodyError(f"The JSON is nested more than {MAX_JSON_DEPTH} levels deep.", "json_too_deep")
            below.extend(child for child in children if type(child) is dict or type(child) is list)
        level = below
        depth += 1


def loads_bounded(raw: bytes | str) -> Any:
    """Parse JSON within the nesting and number bounds of the module docstring.

    Raises ``JSONBodyError`` (bounds) or ``ValueError`` (not JSON; ``UnicodeDecodeError`` for bytes
    that are not UTF-8).
    """
    try:
        value = json.loads(raw, parse_constant=_reject_constant, parse_float=_finite_float, parse_int=_safe_int)
    except RecursionError as err:
        raise JSONBodyError(f"The JSON is nested more than {MAX_JSON_DEPTH} levels deep.", "json_too_deep") from err
    _check_depth(value)
    return value


def text_problem(text: str) -> tuple[str, str] | None:
    """(message, type) when ``text`` holds NUL or a lone surrogate; DRF's CharField types, for one vocabulary."""
    if "\x00" in text:
        return "Null characters are not allowed.", "null_characters_not_allowed"
    if not text.isascii():
        found = _SURROGATE.search(text)
        if found is not None:
            return (
                f"Surrogate characters are not allowed: U+{ord(found.group()):X}.",
                "surrogate_characters_not_allowed",
            )
    return None


def unstorable(value: Any, loc: Sequence[str | int] = ()) -> tuple[tuple[str | int, ...], str, str] | None:
    """The first string of ``value`` (an object key or a value, at any depth) that ``text_problem`` refuses,
    as (where, message, type), or None. ``loc`` is where ``value`` sits; a refused key is shown escaped
    (``\\x00``, ``\\ud800``), as it could not be written back."""
    try:
        # The C encoder first: it writes NUL as the escape below and keeps a lone surrogate, which
        # UTF-8 refuses. Only a value it flags (or cannot write) is walked, to say where.
        text = json.dumps(value, ensure_ascii=False, check_circular=False)
        text.encode("utf-8")
        if "\\u0000" not in text:
            return None
    except (UnicodeEncodeError, TypeError, ValueError, RecursionError):
        pass
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, tuple(loc))]
    while stack:
        item, at = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem is not None:
                return (at, *problem)
        elif isinstance(item, dict):
            for key, child in item.items():
                problem = text_problem(key) if isinstance(key, str) else None
                if problem is not None:
                    shown = key.encode("utf-8", "backslashreplace").decode("utf-8")
                    return ((*at, shown), *problem)
                stack.append((child, (*at, key)))
        elif isinstance(item, list):
            stack.extend((child, (*at, index)) for index, child in enumerate(item))
    return None
