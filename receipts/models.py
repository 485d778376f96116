"""Receipts (signed, immutable evidence of each governed call) and refund reconciliation items."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from billing.models import LedgerEntry, Wallet
from common.modelparts import WrittenOnce
from permits.models import Permit


class Outcome(models.TextChoices):
    """Receipt outcomes (docs/architecture.md, "The outcome table")."""

    SUCCESS = "success"
    TOOL_ERROR = "tool_error"
    RESPONSE_REJECTED = "response_rejected"
    DELIVERY_UNCERTAIN = "delivery_uncertain"
    FAILED_REFUNDED = "failed_refunded"
    FAILED_UNREFUNDED = "failed_unrefunded"
    DENIED = "denied"
    INSUFFICIENT_FUNDS = "insufficient_funds"


class Receipt(WrittenOnce):
    """The signed record of one governed action's outcome. Immutable once written.

    ``signed_statement`` is exactly what was signed; the columns beside it are
    copies for querying. ``request_document`` (tool name and arguments) is kept
    so that the request hash can be recomputed when evidence is checked. The
    action that produced the receipt holds the foreign key to it; the receipt
    stores the action id as plain text (the gateway app sits above this one).
    """

    receipt_id = models.CharField(max_length=40, primary_key=True)
    # tenant, wallet and permit are indexed by the (x, created_at) indexes below, which lead with them.
    tenant_id = models.CharField(max_length=40)
    action_id = models.CharField(max_length=40)
    wallet = models.ForeignKey(
        Wallet, on_delete=models.PROTECT, db_constraint=False, related_name="receipts", db_index=False
    )
    permit = models.ForeignKey(
        Permit,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        db_constraint=False,
        related_name="receipts",
        db_index=False,
    )
    api_key_id = models.CharField(max_length=40)
    tool = models.CharField(max_length=200)
    outcome = models.CharField(max_length=32, choices=Outcome.choices)
    reason_code = models.CharField(max_length=64, blank=True, default="")
    request_hash = models.CharField(max_length=64)
    request_document = models.JSONField()
    response_hash = models.CharField(max_length=64, blank=True, default="")
    credits_authorized = models.DecimalField(max_digits=20, decimal_places=8)
    credits_charged = models.DecimalField(max_digits=20, decimal_places=8)
    ledger_entry = models.ForeignKey(
        LedgerEntry, null=True, blank=True, on_delete=models.PROTECT, db_constraint=False, related_name="receipts"
    )
    refund_entry = models.ForeignKey(
        LedgerEntry,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        db_constraint=False,
        related_name="refund_receipts",
    )
    quote_id = models.CharField(max_length=40, blank=True, default="")
    audit_event_id = models.CharField(max_length=40)
    policy_decision_id = models.CharField(max_length=40, blank=True, default="")
    # The upstream server the call went to and the URL it was sent to (null: a local tool, or a
    # receipt signed before these were part of the statement).
    upstream_server_id = models.CharField(max_length=40, null=True, blank=True)
    upstream_url = models.CharField(max_length=2000, null=True, blank=True)
    created_at = models.DateTimeField()
    signed_statement = models.JSONField()
    signature = models.CharField(max_length=200)
    key_id = models.CharField(max_length=40)

    class Meta:
        db_table = "receipts_receipt"
        # Console permissions a superuser grants (docs/architecture.md, "Tenancy and authority"; the
        # groups in mcpgateway 0002).
        permissions = [
            ("reconcile", "Can record reconciliation results and post owed refunds"),
        ]
        # One receipt per action, within the action's tenant (docs/scaling.md: every unique key carries it).
        constraints = [models.UniqueConstraint(fields=["action_id", "tenant_id"], name="receipt_action_unique")]
        indexes = [
            models.Index(fields=["tenant_id", "created_at"], name="receipt_tenant_created"),
            models.Index(fields=["wallet", "created_at"], name="receipt_wallet_created"),
            models.Index(fields=["permit", "created_at"], name="receipt_permit_created"),
            models.Index(fields=["outcome", "created_at"], name="receipt_outcome_created"),
        ]

    def __str__(self) -> str:
        return f"{self.receipt_id} {self.tool} {self.outcome}"


class ReconciliationStatus(models.TextChoices):
    PENDING = "pending"
    RESOLVED = "resolved"


class RefundReconciliation(models.Model):
    """A refund that is owed for a receipt and not yet posted (at most one per receipt).

    Opened when a refund could not be posted (``failed_unrefunded``) or when an
    operator records that a ``delivery_uncertain`` call was not executed.
    ``refund_reconciliation_retry`` posts the refund at most once and resolves it.
    """

    receipt = models.OneToOneField(
        Receipt, on_delete=models.PROTECT, db_constraint=False, related_name="reconciliation"
    )
    tenant_id = models.CharField(max_length=40, db_index=True)
    amount = models.DecimalField(max_digits=20, decimal_places=8)
    status = models.CharField(max_length=16, choices=ReconciliationStatus.choices, default=ReconciliationStatus.PENDING)
    origin = models.CharField(max_length=32, help_text="failed_unrefunded or operator_not_executed")
    reason = models.CharField(max_length=500, blank=True, default="")
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.CharField(max_length=500, blank=True, default="")
    refund_entry = models.OneToOneField(
        LedgerEntry, null=True, blank=True, on_delete=models.PROTECT, db_constraint=False, related_name="reconciliation"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.CharField(max_length=100, blank=True, default="")

    class Meta:
        db_table = "receipts_refund_reconciliation"
        constraints = [
            models.CheckConstraint(
                condition=Q(status="resolved", refund_entry__isnull=False, resolved_at__isnull=False)
                | Q(status="pending", refund_entry__isnull=True),
                name="reconciliation_resolved_has_refund",
            ),
            models.CheckConstraint(condition=Q(amount__gt=0), name="reconciliation_amount_positive"),
        ]
        indexes = [models.Index(fields=["status", "created_at"], name="reconciliation_status")]

    def __str__(self) -> str:
        return f"refund {self.amount} for {self.receipt_id} ({self.status})"


class ReconciliationVerdict(models.TextChoices):
    EXECUTED = "executed", "executed (the charge stands)"
    NOT_EXECUTED = "not_executed", "not executed (a refund is owed)"


class ReconciliationResult(models.Model):
    """The operator's external reconciliation result for a ``delivery_uncertain`` receipt: one per receipt.

    Recorded by ``reconciliation_record_executed`` and ``refund_reconciliation_mark_not_executed``
    under the receipt's row lock. The same result again changes nothing; the other one is refused
    (409), so a charge kept as executed cannot later be refunded by a second click, nor a refund owed
    be silently contradicted.
    """

    receipt = models.OneToOneField(
        Receipt, on_delete=models.PROTECT, db_constraint=False, related_name="reconciliation_result"
    )
    tenant_id = models.CharField(max_length=40, db_index=True)
    verdict = models.CharField(max_length=16, choices=ReconciliationVerdict.choices)
    actor = models.CharField(max_length=100, blank=True, default="")
    note = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "receipts_reconciliation_result"

    def __str__(self) -> str:
        return f"{self.receipt_id}: {self.verdict}"
