"""List conventions (docs/architecture.md, "HTTP contract"): ``limit`` 1..200 (default 50), ``offset`` >= 0.

Lists answer ``{"items": [...], "total": N, "limit": L, "offset": O}``.
"""

from __future__ import annotations

from typing import Any, TypeVar

from django.db.models import Model, QuerySet
from rest_framework import serializers
from rest_framework.request import Request

from common.errors import RequestValidationError, flatten_drf_errors

MAX_LIMIT = 200
DEFAULT_LIMIT = 50
MAX_OFFSET = 1_000_000_000  # far past any real list; keeps the SQL OFFSET inside bigint

S = TypeVar("S", bound=serializers.Serializer)


class PageQuery(serializers.Serializer):
    """Pagination query parameters."""

    limit = serializers.IntegerField(min_value=1, max_value=MAX_LIMIT, default=DEFAULT_LIMIT)
    offset = serializers.IntegerField(min_value=0, max_value=MAX_OFFSET, default=0)


def parse_query(request: Request, serializer_class: type[S]) -> dict[str, Any]:
    """Validate query parameters with ``serializer_class``; 422 with ``loc: ["query", name]``."""
    data = {key: request.query_params.get(key) for key in request.query_params}
    serializer = serializer_class(data=data)
    if not serializer.is_valid():
        raise RequestValidationError(flatten_drf_errors(serializer.errors, ["query"]))
    return dict(serializer.validated_data)


def page(queryset: QuerySet[Any], params: dict[str, Any], serializer_class: type[Any]) -> dict[str, Any]:
    """Slice ``queryset`` by ``params['limit']``/``params['offset']`` and wrap it in the list envelope."""
    limit, offset = params["limit"], params["offset"]
    total = queryset.count()
    rows: list[Model] = list(queryset[offset : offset + limit])
    return {
        "items": serializer_class(rows, many=True).data,
        "total": total,
        "limit": limit,
        "offset": offset,
    }


def list_envelope(name: str, item_serializer: type[serializers.Serializer]) -> type[serializers.Serializer]:
    """Build a named list-response serializer for the OpenAPI schema."""
    return type(
        name,
        (serializers.Serializer,),
        {
            "items": item_serializer(many=True),
            "total": serializers.IntegerField(),
            "limit": serializers.IntegerField(),
            "offset": serializers.IntegerField(),
            "__doc__": f"A page of {item_serializer.__name__} items.",
        },
    )


def parse_body(request: Request, serializer_class: type[S]) -> dict[str, Any]:
    """Validate the JSON body with ``serializer_class``; 422 with ``loc: ["body", ...]``."""
    data = request.data
    if not isinstance(data, dict):
        raise RequestValidationError.single(["body"], "The body must be a JSON object.", "dict_type")
    serializer = serializer_class(data=data)
    wrong_types = [
        {"loc": ["body", name], "msg": "Input should be a valid string.", "type": "string_type"}
        for name, field in serializer.fields.items()
        if isinstance(field, serializers.CharField) and name in data and data[name] is not None
        if not isinstance(data[name], str)
    ]
    if wrong_types:  # DRF would quietly turn 5 into "5"
        raise RequestValidationError(wrong_types)
    if not serializer.is_valid():
        raise RequestValidationError(flatten_drf_errors(serializer.errors, ["body"]))
    return dict(serializer.validated_data)
