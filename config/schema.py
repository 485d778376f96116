"""Shared OpenAPI records: the error shapes of DESIGN.md section 8."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers


class ErrorDetail(serializers.Serializer):
    """Machine-readable error code, human-readable message, and context fields."""

    error = serializers.CharField()
    message = serializers.CharField()


class ErrorResponse(serializers.Serializer):
    """Every error except 422 validation failures."""

    detail = ErrorDetail()


class ValidationErrorItem(serializers.Serializer):
    """One validation failure: where, what and which kind."""

    loc = serializers.ListField(child=serializers.JSONField())
    msg = serializers.CharField()
    type = serializers.CharField()


class HTTPValidationError(serializers.Serializer):
    """422: the request did not validate."""

    detail = ValidationErrorItem(many=True)


class RateLimitedDetail(ErrorDetail):
    retry_after_seconds = serializers.IntegerField()


class RateLimitedResponse(serializers.Serializer):
    """429: too many requests in the current window."""

    detail = RateLimitedDetail()


_DESCRIPTIONS = {
    401: "Missing, malformed, too short, unknown or revoked API key.",
    402: "Insufficient credits.",
    403: "The caller lacks access to this wallet, tenant or operation.",
    404: "No such resource (or not visible to the caller).",
    409: "Conflict with the current state (for example an idempotency key still in progress).",
    422: "Request validation error.",
    429: "Rate limit exceeded.",
}


def error_responses(*codes: int) -> dict[int, Any]:
    """OpenAPI response entries for the given error statuses (429 is always included)."""
    out: dict[int, Any] = {}
    for code in (*codes, 429):
        if code == 422:
            out[code] = OpenApiResponse(HTTPValidationError, description=_DESCRIPTIONS[code])
        elif code == 429:
            out[code] = OpenApiResponse(RateLimitedResponse, description=_DESCRIPTIONS[code])
        else:
            out[code] = OpenApiResponse(ErrorResponse, description=_DESCRIPTIONS[code])
    return out


ERRORS_KEY = error_responses(401, 403, 404, 422)
