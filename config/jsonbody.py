"""The one JSON reader for request bodies: bounded size, bounded nesting, finite and exact numbers.

Every body a client sends is read here, by DRF (``BoundedJSONParser``) and by the
MCP transports alike, so a hostile body is a 4xx everywhere, never a 500:

* size: bodies above ``DATA_UPLOAD_MAX_MEMORY_SIZE`` are refused with 413 before they
  are read (``BodySizeLimitMiddleware``, by ``Content-Length``);
* nesting: more than ``MAX_JSON_DEPTH`` levels of arrays and objects is 422
  (``json_too_deep``), checked on the parsed value and on the parser's own recursion;
* numbers: ``NaN``, ``Infinity``, numbers that overflow to infinity (``1e400``) and
  integers outside the range every JSON implementation reads exactly
  (``±(2**53 - 1)``) are 422 (``number_out_of_range``): they could not be signed,
  stored and read back unchanged.

Strings are held to their rule where a value is stored or signed (``check_storable``):
no NUL (PostgreSQL text and jsonb cannot hold it) and no lone surrogate (not UTF-8, so
neither stored nor canonicalized by RFC 8785). A body that is only read, such as a
document to verify, may still carry them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from rest_framework.parsers import JSONParser

from config.errors import PayloadTooLarge, RequestValidationError, json_error

MAX_JSON_DEPTH = 64
MAX_SAFE_INTEGER = 2**53 - 1
_SURROGATE = re.compile("[\ud800-\udfff]")


class JSONBodyError(ValueError):
    """A body that is JSON but outside the bounds above; ``type`` is the 422 error type."""

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
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > MAX_JSON_DEPTH:
            raise JSONBodyError(f"The JSON is nested more than {MAX_JSON_DEPTH} levels deep.", "json_too_deep")
        stack.extend((child, depth + 1) for child in children)


def _text_error(text: str) -> tuple[str, str] | None:
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


def storable_text(value: Any) -> str | None:
    """``value`` when it is a string that may be stored, queried and echoed (no NUL, no lone surrogate), else None.

    For strings read from a document that is only verified: a value outside that rule names
    nothing that can exist here, so it is looked up as nothing and echoed as null.
    """
    return value if isinstance(value, str) and _text_error(value) is None else None


def check_storable(value: Any, loc: Sequence[str | int]) -> None:
    """422 at a string of ``value`` (an object key or a value, at any depth) holding NUL or a lone surrogate.

    ``loc`` is where ``value`` sits in the request; the error's ``loc`` goes on down to the string.
    """
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, tuple(loc))]
    while stack:
        item, at = stack.pop()
        if isinstance(item, str):
            error = _text_error(item)
            if error is not None:
                raise RequestValidationError.single(at, *error)
        elif isinstance(item, dict):
            for key, child in item.items():
                error = _text_error(key) if isinstance(key, str) else None
                if error is not None:  # the key, escaped where it cannot be written back in the answer
                    shown = key.encode("utf-8", "backslashreplace").decode("utf-8")
                    raise RequestValidationError.single((*at, shown), *error)
                stack.append((child, (*at, key)))
        elif isinstance(item, list):
            stack.extend((child, (*at, index)) for index, child in enumerate(item))


def loads_bounded(raw: bytes | str) -> Any:
    """Parse a request body within the bounds of the module docstring.

    Raises ``JSONBodyError`` (bounds) or ``ValueError`` (not JSON).
    """
    try:
        value = json.loads(raw, parse_constant=_reject_constant, parse_float=_finite_float, parse_int=_safe_int)
    except RecursionError as err:
        raise JSONBodyError(f"The JSON is nested more than {MAX_JSON_DEPTH} levels deep.", "json_too_deep") from err
    _check_depth(value)
    return value


class BoundedJSONParser(JSONParser):
    """DRF's JSON parser reading through ``loads_bounded``: bounds are 422 with ``loc: ["body"]``."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        from rest_framework.exceptions import ParseError

        raw = stream.read() if stream is not None else b""
        if not raw:
            raise ParseError("The body is empty.")
        try:
            return loads_bounded(raw)
        except JSONBodyError as err:
            raise RequestValidationError.single(["body"], str(err), err.type) from err
        except (ValueError, UnicodeDecodeError) as err:
            raise ParseError(f"JSON parse error - {err}") from err


class BodySizeLimitMiddleware:
    """413 ``payload_too_large`` for a body declared above ``DATA_UPLOAD_MAX_MEMORY_SIZE``, before it is read."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if limit is not None and length > limit:
            return json_error(request, PayloadTooLarge(limit_bytes=limit, content_length=length))
        return self.get_response(request)
