"""The tool registry, the governed action (one row per logical call) and MCP handshake sessions."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from billing.models import LedgerEntry, ServiceCategory, Wallet
from permits.models import Permit
from receipts.models import Receipt


class ToolSource(models.TextChoices):
    UPSTREAM = "upstream"
    LOCAL = "local"


class UpstreamTransport(models.TextChoices):
    STREAMABLE_HTTP = "streamable_http"
    # The legacy HTTP+SSE transport of MCP 2024-11-05: ``url`` is the SSE endpoint (docs/decisions.md,
    # "Upstream servers"; ``mcpgateway.upstream.legacy_sse``).
    HTTP_SSE = "http_sse"


class CredentialKind(models.TextChoices):
    BEARER = "bearer"
    HEADERS = "headers"
    # A token endpoint, a client id and secret, a scope and an RFC 8707 resource: the access token the
    # gateway obtains with them is sent (docs/decisions.md, "Upstream servers").
    OAUTH_CLIENT_CREDENTIALS = "oauth_client_credentials"


class UpstreamServer(models.Model):
    """An upstream MCP server the operator manages: where its tools are called, with which limits.

    Reference data shared by every tenant, written off the hot path (console, operator API,
    ``UPSTREAM_MCP_URL`` at start for the server ``default``). ``tenant_ids``: null, every tenant;
    a list, only those tenants (ids, not foreign keys: tenants may live on other shards).
    ``tool_prefix`` names its tools (``<prefix>.<name>``; one server may have none).
    ``credentials_required``: a call is refused before its debit unless the server, or the
    calling tenant, holds credentials for it (``UpstreamCredential``).
    ``credentials_version`` moves on every change of its credentials, so that per-process
    clients and credential caches built on older ones are replaced.
    """

    server_id = models.CharField(max_length=40, primary_key=True)
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    url = models.URLField(max_length=2000)
    transport = models.CharField(
        max_length=16, choices=UpstreamTransport.choices, default=UpstreamTransport.STREAMABLE_HTTP
    )
    connect_timeout = models.FloatField(default=2.0)
    read_timeout = models.FloatField(default=15.0)
    enabled = models.BooleanField(default=True)
    required = models.BooleanField(default=False, help_text="readiness waits for this server")
    default_category = models.CharField(max_length=32, choices=ServiceCategory.choices, default=ServiceCategory.TOOLING)
    tool_prefix = models.CharField(max_length=64, blank=True, default="")
    tenant_ids = models.JSONField(null=True, blank=True)
    credentials_required = models.BooleanField(default=False)
    credentials_version = models.PositiveIntegerField(default=0)
    last_synced_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "mcpgateway_upstream_server"
        ordering = ["slug"]
        constraints = [
            models.UniqueConstraint(fields=["tool_prefix"], name="upstream_server_tool_prefix_unique"),
            models.CheckConstraint(
                condition=Q(connect_timeout__gt=0) & Q(read_timeout__gt=0), name="upstream_server_timeouts_positive"
            ),
        ]

    def __str__(self) -> str:
        return self.slug

    def open_to(self, tenant_id: str) -> bool:
        """Whether ``tenant_id`` may call this server's tools (null ``tenant_ids``: every tenant)."""
        return self.tenant_ids is None or tenant_id in self.tenant_ids

    def exposed_name(self, remote_name: str) -> str:
        """The name the gateway exposes for the upstream's tool ``remote_name``."""
        return f"{self.tool_prefix}.{remote_name}" if self.tool_prefix else remote_name


class UpstreamErrorClass(models.TextChoices):
    """Why a server could not be used, as a fixed word (never the upstream's text or its URL)."""

    AUTH_REFUSED = "auth_refused"
    SERVER_ERROR = "server_error"
    HTTP_ERROR = "http_error"
    TIMEOUT = "timeout"
    UNREACHABLE = "unreachable"
    PROTOCOL_ERROR = "protocol_error"
    CREDENTIALS_UNAVAILABLE = "credentials_unavailable"  # no OAuth access token could be had


class UpstreamProbeSource(models.TextChoices):
    READINESS = "readiness"
    CONSOLE = "console"
    API = "api"
    SYNC = "sync"


class UpstreamServerState(models.Model):
    """The last probe of an upstream server: reachable or not (with an error class), its protocol version, when.

    A row of its own, not columns of ``UpstreamServer``: readiness probes every few seconds, and any
    write to the server's row moves ``gateway_tool_version`` for all its tools, so every process would
    decide their calls again (docs/decisions.md, "Upstream servers"). Written only by
    ``upstreams.upstream_server_state_record``, never audited (a probe is not an operator's change).
    """

    server = models.OneToOneField(UpstreamServer, on_delete=models.CASCADE, primary_key=True, related_name="state")
    checked_at = models.DateTimeField()
    checked_by = models.CharField(max_length=16, choices=UpstreamProbeSource.choices)
    reachable = models.BooleanField()
    protocol_version = models.CharField(max_length=32, blank=True, default="")
    error_class = models.CharField(max_length=32, blank=True, default="", choices=UpstreamErrorClass.choices)

    class Meta:
        db_table = "mcpgateway_upstream_server_state"
        constraints = [
            # Reachable has no error class; unreachable has one of the fixed words, never free text.
            models.CheckConstraint(
                condition=Q(reachable=True, error_class="")
                | Q(reachable=False, error_class__in=UpstreamErrorClass.values),
                name="upstream_server_state_error_class",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.server_id} {'reachable' if self.reachable else self.error_class}"


class UpstreamCredential(models.Model):
    """What the gateway sends to one upstream server: server-wide (``tenant_id`` null) or one tenant's own.

    A static bearer token, static headers, or OAuth 2.0 client credentials whose access token the
    gateway obtains and caches per process (``upstreams.upstream_token``).

    ``secret`` is the encrypted blob (``mcpgateway.upstream.secrets``); nothing reads it back out
    of the console or the API (write-only). A tenant's credential replaces the server's for that
    tenant's calls.
    """

    credential_id = models.CharField(max_length=40, primary_key=True)
    server = models.ForeignKey(UpstreamServer, on_delete=models.CASCADE, related_name="credentials")
    tenant_id = models.CharField(max_length=40, null=True, blank=True)
    kind = models.CharField(max_length=32, choices=CredentialKind.choices)
    secret = models.BinaryField()
    set_at = models.DateTimeField()

    class Meta:
        db_table = "mcpgateway_upstream_credential"
        constraints = [
            models.UniqueConstraint(fields=["server", "tenant_id"], name="upstream_credential_tenant_unique"),
            models.UniqueConstraint(
                fields=["server"], condition=Q(tenant_id__isnull=True), name="upstream_credential_server_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.server_id} {self.tenant_id or '*'} {self.kind}"


class Tool(models.Model):
    """A callable tool: synced from an upstream server, or the local dogfood tool.

    ``service_id`` is the name the gateway exposes: the server's ``tool_prefix``, a dot and
    ``remote_name`` (the name at the upstream), or ``remote_name`` alone when the server has no
    prefix. A tool without a server is the local tool, or an upstream tool registered before
    servers were records (it is the ``UPSTREAM_MCP_URL`` server's). Prices live in billing
    (``billing.ToolPrice``); a tool without a price cannot be called or quoted.
    """

    service_id = models.CharField(max_length=200, primary_key=True)
    server = models.ForeignKey(UpstreamServer, null=True, blank=True, on_delete=models.PROTECT, related_name="tools")
    remote_name = models.CharField(max_length=200, blank=True, default="")
    title = models.CharField(max_length=200, blank=True, default="")
    description = models.TextField(blank=True, default="")
    input_schema = models.JSONField(default=dict)
    # Why the gateway cannot validate arguments against ``input_schema`` (``mcpgateway.argschema``), found
    # by ``tools_sync``; empty when it can. A tool with a reason is refused (``ToolSchemaUnusable``).
    input_schema_problem = models.TextField(blank=True, default="")
    output_schema = models.JSONField(null=True, blank=True)
    annotations = models.JSONField(default=dict, blank=True)
    category = models.CharField(max_length=32, choices=ServiceCategory.choices, default=ServiceCategory.TOOLING)
    source = models.CharField(max_length=16, choices=ToolSource.choices, default=ToolSource.UPSTREAM)
    enabled = models.BooleanField(default=True)
    synced_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "mcpgateway_tool"
        ordering = ["service_id"]

    def __str__(self) -> str:
        return self.service_id

    @property
    def name(self) -> str:
        return self.service_id

    @property
    def upstream_name(self) -> str:
        """The name the upstream knows the tool by (``tools/call``'s ``name``)."""
        return self.remote_name or self.service_id


class ActionState(models.TextChoices):
    """Where a logical action is in the canonical loop."""

    ACCEPTED = "accepted"
    DISPATCH_CLAIMED = "dispatch_claimed"
    COMPLETED = "completed"
    DELIVERY_UNCERTAIN = "delivery_uncertain"
    DENIED = "denied"


class Action(models.Model):
    """One logical action: unique per (wallet, idempotency key) across every transport.

    Phase 1 creates it and, in the same transaction, authorizes, reserves,
    debits and claims the dispatch (``dispatch_claimed``) or records a refusal
    (``denied``). Phase 3 records the outcome (``completed`` or
    ``delivery_uncertain``). ``response`` is the transport-neutral stored answer
    that every replay of the key returns; nothing is ever re-dispatched.
    """

    action_id = models.CharField(max_length=40, primary_key=True)
    tenant_id = models.CharField(max_length=40)
    # Indexed by the unique (wallet, idempotency_key) index, which leads with it.
    wallet = models.ForeignKey(
        Wallet, on_delete=models.PROTECT, db_constraint=False, related_name="actions", db_index=False
    )
    api_key_id = models.CharField(max_length=40)
    idempotency_key = models.CharField(max_length=255)
    request_hash = models.CharField(max_length=64)
    tool = models.CharField(max_length=200)
    arguments = models.JSONField(default=dict)
    transport = models.CharField(max_length=32)
    state = models.CharField(max_length=32, choices=ActionState.choices, default=ActionState.ACCEPTED)
    outcome = models.CharField(max_length=32, blank=True, default="")
    reason_code = models.CharField(max_length=64, blank=True, default="")
    permit = models.ForeignKey(
        Permit, null=True, blank=True, on_delete=models.PROTECT, db_constraint=False, related_name="actions"
    )
    quote_id = models.CharField(max_length=40, blank=True, default="")
    price = models.DecimalField(max_digits=20, decimal_places=8, null=True, blank=True)
    ledger_entry = models.ForeignKey(
        LedgerEntry, null=True, blank=True, on_delete=models.PROTECT, db_constraint=False, related_name="actions"
    )
    receipt = models.OneToOneField(
        Receipt, null=True, blank=True, on_delete=models.PROTECT, db_constraint=False, related_name="action"
    )
    policy_decision_id = models.CharField(max_length=40, blank=True, default="")
    # Where the call was sent, as claimed (the server's id, its URL and timeouts then): the evidence
    # names it after the server's URL changes, and the sweeper waits this server's timeouts.
    upstream_server_id = models.CharField(max_length=40, null=True, blank=True)
    upstream_url = models.CharField(max_length=2000, null=True, blank=True)
    upstream_connect_timeout = models.FloatField(null=True, blank=True)
    upstream_read_timeout = models.FloatField(null=True, blank=True)
    response = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField()
    claimed_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "mcpgateway_action"
        constraints = [
            models.UniqueConstraint(
                fields=["wallet", "idempotency_key", "tenant_id"], name="action_wallet_idempotency_unique"
            ),
            models.CheckConstraint(
                condition=~Q(state__in=["completed", "delivery_uncertain", "denied"]) | Q(receipt__isnull=False),
                name="action_finished_has_receipt",
            ),
        ]
        indexes = [
            models.Index(fields=["state", "claimed_at"], name="action_claimed", condition=Q(state="dispatch_claimed")),
            models.Index(fields=["tenant_id", "created_at"], name="action_tenant_created"),
        ]

    def __str__(self) -> str:
        return f"{self.action_id} {self.tool} {self.state}"

    @property
    def finished(self) -> bool:
        return self.state in (ActionState.COMPLETED, ActionState.DELIVERY_UNCERTAIN, ActionState.DENIED)


class McpSession(models.Model):
    """An MCP handshake session (``Mcp-Session-Id``), in PostgreSQL so any gateway instance can serve it."""

    session_id = models.CharField(max_length=64, primary_key=True)
    api_key_id = models.CharField(max_length=40)
    protocol_version = models.CharField(max_length=32)
    client_info = models.JSONField(default=dict, blank=True)
    initialized = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "mcpgateway_session"
        indexes = [
            models.Index(fields=["created_at"], name="mcp_session_created"),  # the sweeper's purge
            # A key's live sessions, newest first: what initialize counts against MCP_SESSIONS_PER_KEY.
            models.Index(
                fields=["api_key_id", "-created_at"], name="mcp_session_key_live", condition=Q(ended_at__isnull=True)
            ),
        ]

    def __str__(self) -> str:
        return self.session_id


class PartnerNote(models.Model):
    """A note written by the local dogfood tool ``partner.notes.write`` (only with ENABLE_DOGFOOD_TOOL)."""

    note_id = models.CharField(max_length=40, primary_key=True)
    tenant_id = models.CharField(max_length=40)
    wallet_id = models.CharField(max_length=40)
    action_id = models.CharField(max_length=40)
    text = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "mcpgateway_partner_note"
        constraints = [models.UniqueConstraint(fields=["action_id", "tenant_id"], name="partner_note_action_unique")]

    def __str__(self) -> str:
        return self.note_id
