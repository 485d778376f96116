"""Records of the tool catalog and the deprecated REST invoke."""

from __future__ import annotations

from rest_framework import serializers

from billing.models import ServiceCategory
from common.pagination import MAX_OFFSET
from mcpgateway.models import CredentialKind, UpstreamTransport


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


# --- Upstream servers (operator API, an extension: /v1/upstreams) ------------------------------------


class UpstreamCredentialSetResponse(serializers.Serializer):
    """Whose credentials are set for a server, of which kind and when (never the secret)."""

    tenant_id = serializers.CharField(allow_null=True)
    kind = serializers.ChoiceField(choices=CredentialKind.choices)
    set_at = serializers.DateTimeField()


class UpstreamServerResponse(serializers.Serializer):
    """An upstream MCP server as the operator manages it (its credentials are never shown)."""

    server_id = serializers.CharField()
    slug = serializers.CharField()
    name = serializers.CharField()
    url = serializers.CharField()
    transport = serializers.ChoiceField(choices=UpstreamTransport.choices)
    connect_timeout = serializers.FloatField()
    read_timeout = serializers.FloatField()
    enabled = serializers.BooleanField()
    required = serializers.BooleanField()  # type: ignore[assignment]  # a field, popped by the metaclass
    default_category = serializers.ChoiceField(choices=ServiceCategory.choices)
    tool_prefix = serializers.CharField(allow_blank=True)
    tenant_ids = serializers.ListField(child=serializers.CharField(), allow_null=True)
    credentials_required = serializers.BooleanField()
    credentials = serializers.ListField(
        child=serializers.CharField(allow_null=True),
        help_text="Whose credentials are set: null for the server's own, else tenant ids (never the secrets).",
    )
    credentials_set = UpstreamCredentialSetResponse(many=True, help_text="Each credential's kind and when it was set.")
    last_synced_at = serializers.DateTimeField(allow_null=True)


class UpstreamServerListResponse(serializers.Serializer):
    items = UpstreamServerResponse(many=True)


class UpstreamServerUpdateRequest(serializers.Serializer):
    """The settings of a server that may change (all optional)."""

    name = serializers.CharField(max_length=200, required=False)
    url = serializers.URLField(max_length=2000, required=False)
    transport = serializers.ChoiceField(
        choices=UpstreamTransport.choices,
        required=False,
        help_text="streamable_http (default), or http_sse: the legacy HTTP+SSE transport, url being its SSE endpoint.",
    )
    connect_timeout = serializers.FloatField(min_value=0.001, max_value=600, required=False)
    read_timeout = serializers.FloatField(min_value=0.001, max_value=600, required=False)
    enabled = serializers.BooleanField(required=False)
    required = serializers.BooleanField(required=False)  # type: ignore[assignment]  # a field, popped by the metaclass
    default_category = serializers.ChoiceField(choices=ServiceCategory.choices, required=False)
    tool_prefix = serializers.RegexField(r"^[A-Za-z0-9_-]*$", max_length=64, allow_blank=True, required=False)
    tenant_ids = serializers.ListField(
        child=serializers.CharField(max_length=40), allow_null=True, required=False, max_length=1000
    )
    credentials_required = serializers.BooleanField(required=False)


class UpstreamServerCreateRequest(UpstreamServerUpdateRequest):
    """A new upstream server: its slug and URL, and any of the settings."""

    slug = serializers.SlugField(max_length=64)
    url = serializers.URLField(max_length=2000)


class UpstreamCredentialRequest(serializers.Serializer):
    """Credentials sent to one server; a tenant's own with ``tenant_id``.

    ``bearer``: ``token``. ``headers``: ``headers``. ``oauth_client_credentials``: ``token_url``,
    ``client_id``, ``client_secret`` and optionally ``scope`` and ``resource`` (RFC 8707); the gateway
    sends the access token it obtains with them (client_secret_basic) and caches it until near its expiry.
    """

    tenant_id = serializers.CharField(max_length=40, required=False, allow_null=True, default=None)
    kind = serializers.ChoiceField(choices=CredentialKind.choices)
    token = serializers.CharField(max_length=8192, required=False)
    headers = serializers.DictField(child=serializers.CharField(max_length=8192), required=False)
    token_url = serializers.CharField(max_length=2000, required=False)
    client_id = serializers.CharField(max_length=500, required=False)
    client_secret = serializers.CharField(max_length=500, required=False, trim_whitespace=False)
    scope = serializers.CharField(max_length=2000, required=False, allow_blank=True)
    resource = serializers.CharField(max_length=2000, required=False, allow_blank=True)


class UpstreamCredentialClearQuery(serializers.Serializer):
    tenant_id = serializers.CharField(max_length=40, required=False, allow_null=True, default=None)


class UpstreamSyncResponse(serializers.Serializer):
    """What a sync did, by exposed tool name."""

    created = serializers.ListField(child=serializers.CharField())
    changed = serializers.ListField(child=serializers.CharField())
    disabled = serializers.ListField(child=serializers.CharField())
    refused = serializers.DictField(child=serializers.CharField())
    invalid = serializers.DictField(child=serializers.CharField())


class UpstreamProbeResponse(serializers.Serializer):
    """A connection test: reachable, the protocol version negotiated, an error class (never the upstream's text)."""

    reachable = serializers.BooleanField()
    protocol_version = serializers.CharField(allow_null=True)
    error = serializers.CharField(allow_null=True)
