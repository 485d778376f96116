"""The one JSON reader for request bodies: bounded size, bounded nesting, finite and exact numbers.

Every body a client sends is read here, by DRF (``BoundedJSONParser``) and by the
MCP transports alike, so a hostile body is a 4xx everywhere, never a 500:

* size: bodies above ``DATA_UPLOAD_MAX_MEMORY_SIZE`` are refused with 413 before they
  are read (``BodySizeLimitMiddleware``, by ``Content-Length``);
* nesting and numbers: outside the bounds of ``common.jsonbounds`` is 422
  (``json_too_deep``, ``number_out_of_range``): such values could not be signed,
  stored and read back unchanged.

Strings are held to their rule where a value is stored or signed (``check_storable``):
no NUL (PostgreSQL text and jsonb cannot hold it) and no lone surrogate (not UTF-8, so
neither stored nor canonicalized by RFC 8785). A body that is only read, such as a
document to verify, may still carry them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from rest_framework.parsers import JSONParser

from common.errors import PayloadTooLarge, RequestValidationError, json_error
from common.jsonbounds import MAX_JSON_DEPTH, JSONBodyError, loads_bounded, text_problem, unstorable

__all__ = [
    "MAX_JSON_DEPTH",
    "BodySizeLimitMiddleware",
    "BoundedJSONParser",
    "JSONBodyError",
    "check_storable",
    "loads_bounded",
    "storable_text",
]


def storable_text(value: Any) -> str | None:
    """``value`` when it is a string that may be stored, queried and echoed (no NUL, no lone surrogate), else None.

    For strings read from a document that is only verified: a value outside that rule names
    nothing that can exist here, so it is looked up as nothing and echoed as null.
    """
    return value if isinstance(value, str) and text_problem(value) is None else None


def check_storable(value: Any, loc: Sequence[str | int]) -> None:
    """422 at a string of ``value`` (an object key or a value, at any depth) holding NUL or a lone surrogate.

    ``loc`` is where ``value`` sits in the request; the error's ``loc`` goes on down to the string.
    """
    found = unstorable(value, loc)
    if found is not None:
        raise RequestValidationError.single(*found)


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
