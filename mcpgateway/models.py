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


class Tool(models.Model):
    """A callable tool: synced from the configured upstream, or the local dogfood tool.

    ``service_id`` is the tool's name (MCP tool names are unique per server and
    URL-safe). Prices live in billing (``billing.ToolPrice``); a tool without a
    price cannot be called or quoted.
    """

    service_id = models.CharField(max_length=200, primary_key=True)
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
