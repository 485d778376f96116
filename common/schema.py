"""Shared OpenAPI records: the error shapes of docs/architecture.md, "HTTP contract"."""

from __future__ import annotations

from typing import Any, ClassVar

from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ResolvedComponent
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers

POSITIVE_MARKER = "x-tollgate-positive"
DIGITS_PATTERN = r"(?:\d{1,%d}(?:\.\d{0,%d})?|\.\d{1,%d})"


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
    502: "An upstream server's answer could not be used (nothing was changed).",
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


class TollgateAutoSchema(AutoSchema):
    """drf-spectacular's AutoSchema, stating what the validators enforce.

    * a request string that may not be blank has ``minLength: 1``;
    * a decimal's pattern requires a digit (``''``, ``-`` and ``.`` are not numbers), and a
      request decimal whose minimum is positive or zero has no minus sign; a positive minimum is
      stated as ``exclusiveMinimum: 0``.
    """

    def _map_serializer_field(self, field: Any, direction: Any, bypass_extensions: bool = False) -> Any:
        schema = super()._map_serializer_field(field, direction, bypass_extensions)
        if not isinstance(schema, dict):
            return schema
        request = direction == "request"
        if (
            request
            and isinstance(field, serializers.CharField)
            and not field.allow_blank
            and schema.get("type") == "string"
            and "minLength" not in schema
            and "enum" not in schema
        ):
            schema["minLength"] = 1
        if isinstance(field, serializers.DecimalField):
            minimum = field.min_value
            if "pattern" in schema:
                places = field.decimal_places or 0
                whole = (field.max_digits or 20) - places
                sign = "" if request and minimum is not None and minimum >= 0 else "-?"
                nonzero = "(?=.*[1-9])" if request and minimum is not None and minimum > 0 else ""
                schema["pattern"] = f"^{nonzero}{sign}{DIGITS_PATTERN % (whole, places, places)}$"
            if request and minimum is not None and minimum > 0:
                # "Greater than 0": the smallest step is an implementation detail. (A literal 0 here
                # would be dropped for query parameters; the hook below writes it.)
                schema.pop("minimum", None)
                schema[POSITIVE_MARKER] = True
        return schema


# Request bodies whose fields are alternatives: one of these sets must be present.
ALTERNATIVES = {
    "PermitVerifyRequest": [["permit_id"], ["permit", "signature"]],
    "ReceiptVerifyRequest": [["receipt_id"], ["receipt", "signature"]],
}


# Fields that go together (both or neither).
TOGETHER = {"CreateAgentWalletRequest": {"refill_threshold": ["refill_amount"], "refill_amount": ["refill_threshold"]}}


def _positive(node: Any) -> None:
    if isinstance(node, dict):
        if node.pop(POSITIVE_MARKER, False):
            node.pop("minimum", None)
            node["exclusiveMinimum"] = 0
        for value in node.values():
            _positive(value)
    elif isinstance(node, list):
        for value in node:
            _positive(value)


def postprocess_alternatives(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular hook: alternatives of the verify bodies (``anyOf`` of required sets), fields that
    go together (``dependentRequired``) and positive decimals (``exclusiveMinimum: 0``)."""
    components = result.get("components", {}).get("schemas", {})
    for name, sets in ALTERNATIVES.items():
        if name in components:
            components[name]["anyOf"] = [{"required": fields} for fields in sets]
    for item in result.get("paths", {}).values():
        for operation in item.values():
            body = operation.get("requestBody") if isinstance(operation, dict) else None
            ref = (body or {}).get("content", {}).get("application/json", {}).get("schema", {}).get("$ref", "")
            if ref.rsplit("/", 1)[-1] in ALTERNATIVES:
                assert body is not None
                body["required"] = True  # one of the alternatives must be sent, so a body must be
    for name, dependent in TOGETHER.items():
        if name in components:
            components[name]["dependentRequired"] = dependent
    _positive(result)
    return result


class NamedChoiceField(serializers.ChoiceField):
    """A choice field documented as a named enum component (``component``) in the schema."""

    def __init__(self, *, component: str, **kwargs: Any) -> None:
        self.component = component
        super().__init__(**kwargs)


class NamedChoiceFieldSchema(OpenApiSerializerFieldExtension):
    """Reference one named enum component instead of an inline enum.

    Several records have a ``status`` with different choice sets; inline enums of one
    name used in several components cannot be named unambiguously by the enum post-processing.
    """

    target_class = "common.schema.NamedChoiceField"

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> Any:
        field = self.target
        component = ResolvedComponent(
            name=field.component,
            type=ResolvedComponent.SCHEMA,
            object=field.component,
            schema={"type": "string", "enum": [str(choice) for choice in field.choices]},
        )
        auto_schema.registry.register_on_missing(component)
        return component.ref


class SignedDocumentVerifyRequest(serializers.Serializer):
    """A verify request naming a signed record by id (``id_field``) or carrying its document
    (``document_field``, the signed statement, with ``signature``): the one rule of the permit's and
    the receipt's verify requests. Subclasses declare the three fields."""

    id_field: ClassVar[str]
    document_field: ClassVar[str]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        document = self.document_field
        if not attrs.get(self.id_field) and attrs.get(document) is None:
            raise serializers.ValidationError(f"Give {self.id_field}, or {document} with signature.")
        if attrs.get(document) is not None and not attrs.get("signature"):
            raise serializers.ValidationError({"signature": f"Required with {document}."})
        return attrs
