"""Records of the tool catalog and the deprecated REST invoke."""

from __future__ import annotations

from rest_framework import serializers

from billing.models import ServiceCategory
from common.pagination import MAX_OFFSET


class ToolDefinition(serializers.Serializer):
    """An MCP tool definition; price, category and service id are in ``_meta``."""

    name = serializers.CharField()
    title = serializers.CharField(required=False)
    description = serializers.CharField()
    inputSchema = serializers.DictField()
    outputSchema = serializers.DictField(required=False)
    annotations = serializers.DictField(required=False)
    _meta = serializers.DictField()


class ToolManifestResponse(serializers.Serializer):
    """The tool manifest: mirrors MCP tools/list."""

    name = serializers.CharField()
    version = serializers.CharField()
    mcp_endpoint = serializers.CharField(allow_null=True)
    tools = ToolDefinition(many=True)


class ToolPageResponse(serializers.Serializer):
    """A page of tool definitions."""

    items = ToolDefinition(many=True)
    total = serializers.IntegerField()
    limit = serializers.IntegerField()
    offset = serializers.IntegerField()


class ToolCategoryQuery(serializers.Serializer):
    category = serializers.ChoiceField(choices=ServiceCategory.choices, required=False)


class ToolPageQuery(ToolCategoryQuery):
    limit = serializers.IntegerField(min_value=1, max_value=500, default=100)
    offset = serializers.IntegerField(min_value=0, max_value=MAX_OFFSET, default=0)


class ToolCallRequest(serializers.Serializer):
    """A governed tool call: the permit, a fresh idempotency key per logical call, and the arguments."""

    # Taken as sent, as MCP takes them: a key or an id with surrounding spaces is refused or not found,
    # never trimmed into another one.
    arguments = serializers.DictField(required=False, default=dict)
    permit_id = serializers.CharField(max_length=40, trim_whitespace=False)
    idempotency_key = serializers.CharField(max_length=255, trim_whitespace=False)
    quote_id = serializers.CharField(max_length=40, required=False, allow_blank=True, default="", trim_whitespace=False)


class ToolCallError(serializers.Serializer):
    code = serializers.IntegerField()
    message = serializers.CharField()
    data = serializers.DictField()  # type: ignore[assignment]  # JSON-RPC member name; the metaclass turns it into a field


class ToolCallResponse(serializers.Serializer):
    """The action's outcome, its receipt id, and the tool result or the error."""

    action_id = serializers.CharField()
    receipt_id = serializers.CharField()
    outcome = serializers.CharField()
    reason_code = serializers.CharField()
    credits_charged = serializers.CharField()
    replayed = serializers.BooleanField()
    result = serializers.DictField(allow_null=True)
    error = ToolCallError(allow_null=True)
