"""Scoped authority: permits, permit requests, quotes, policy bundles and approvers."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import F, Q

from billing.models import Wallet

ZERO = Decimal("0")


class Lapsing:
    """A row whose open status lapses at ``expires_at`` (a pending request or proposal, an active quote):
    from then on it reads as expired (``effective_status``; ``permits.selectors.lapsing_status_filter``
    selects by it), whatever the stored status still says until something writes it."""

    OPEN_STATUS: str
    EXPIRED_STATUS: str
    status: Any
    expires_at: Any

    def effective_status(self, now: object) -> str:
        if self.status == self.OPEN_STATUS and self.expires_at <= now:
            return self.EXPIRED_STATUS
        return str(self.status)


class PermitStatus(models.TextChoices):
    ACTIVE = "active"
    REVOKED = "revoked"
    EXPIRED = "expired"
    EXHAUSTED = "exhausted"


class Permit(models.Model):
    """A signed grant: wallet ``wallet`` may call ``allowed_tools`` for up to ``max_credits``.

    The signed statement (``signed_statement`` + ``signature``) freezes the grant;
    ``spent_credits`` and ``calls_used`` move only through the conditional updates
    of ``permit_reserve`` and ``permit_release``, and the database refuses a spend
    above the allowance. ``status`` stores ``active`` or ``revoked``; ``expired``
    and ``exhausted`` are derived from the clock and the counters
    (see :meth:`effective_status`) and also written back when first observed.
    """

    permit_id = models.CharField(max_length=40, primary_key=True)
    tenant_id = models.CharField(max_length=40, db_index=True)
    wallet = models.ForeignKey(Wallet, on_delete=models.PROTECT, db_constraint=False, related_name="permits")
    issuer_wallet = models.ForeignKey(
        Wallet, null=True, blank=True, on_delete=models.PROTECT, db_constraint=False, related_name="issued_permits"
    )
    issued_by_key_id = models.CharField(max_length=40, blank=True, default="")
    # Unsigned, for reference: whether a person approved the permit is read from its signed statement's
    # ``approval`` (permits.services.approval_record), never from this column.
    issued_via_request_id = models.CharField(max_length=40, blank=True, default="")
    subject_key_id = models.CharField(max_length=40, null=True, blank=True)
    allowed_tools = models.JSONField(default=list)
    # The upstream servers (their slugs) whose tools it covers; null: any. Signed (docs/decisions.md, Authority).
    allowed_servers = models.JSONField(null=True, blank=True, default=None)
    max_credits = models.DecimalField(max_digits=20, decimal_places=8)
    spent_credits = models.DecimalField(max_digits=20, decimal_places=8, default=ZERO)
    max_calls = models.PositiveIntegerField(null=True, blank=True)
    calls_used = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=16, choices=PermitStatus.choices, default=PermitStatus.ACTIVE)
    expires_at = models.DateTimeField()
    created_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoke_reason = models.CharField(max_length=200, blank=True, default="")
    idempotency_scope = models.CharField(max_length=64, blank=True, default="")
    idempotency_key = models.CharField(max_length=255, blank=True, default="")
    request_hash = models.CharField(max_length=64, blank=True, default="")
    signed_statement = models.JSONField()
    signature = models.CharField(max_length=200)
    key_id = models.CharField(max_length=40, help_text="Evidence signing key (kid) that signed this permit.")

    class Meta:
        db_table = "permits_permit"
        # Console permissions a superuser grants (docs/architecture.md, "Tenancy and authority"; the
        # groups in mcpgateway 0002).
        permissions = [
            ("revoke_permit", "Can revoke permits"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(spent_credits__gte=0), name="permit_spent_non_negative"),
            models.CheckConstraint(
                condition=Q(spent_credits__lte=F("max_credits")), name="permit_spent_within_allowance"
            ),
            models.CheckConstraint(condition=Q(max_credits__gt=0), name="permit_allowance_positive"),
            models.CheckConstraint(
                condition=Q(max_calls__isnull=True) | Q(calls_used__lte=F("max_calls")),
                name="permit_calls_within_max",
            ),
            models.UniqueConstraint(
                fields=["idempotency_scope", "idempotency_key", "tenant_id"],
                condition=~Q(idempotency_key=""),
                name="permit_idempotency_unique",
            ),
        ]
        indexes = [
            models.Index(fields=["wallet", "status", "expires_at"], name="permit_wallet_status"),
            models.Index(fields=["tenant_id", "created_at"], name="permit_tenant_created"),
        ]

    def __str__(self) -> str:
        return f"{self.permit_id} for {self.wallet_id}"

    def effective_status(self, now: object) -> str:
        if self.status == PermitStatus.REVOKED:
            return PermitStatus.REVOKED
        if self.expires_at <= now:  # type: ignore[operator]
            return PermitStatus.EXPIRED
        if self.spent_credits >= self.max_credits or (self.max_calls is not None and self.calls_used >= self.max_calls):
            return PermitStatus.EXHAUSTED
        return PermitStatus.ACTIVE


class PermitRequestStatus(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"


class PermitRequest(Lapsing, models.Model):
    """An agent's request for a permit it cannot mint itself; a human approves or rejects it."""

    OPEN_STATUS = PermitRequestStatus.PENDING
    EXPIRED_STATUS = PermitRequestStatus.EXPIRED

    request_id = models.CharField(max_length=40, primary_key=True)
    tenant_id = models.CharField(max_length=40, db_index=True)
    wallet = models.ForeignKey(Wallet, on_delete=models.PROTECT, db_constraint=False, related_name="permit_requests")
    requested_by_key_id = models.CharField(max_length=40)
    allowed_tools = models.JSONField(default=list)
    allowed_servers = models.JSONField(null=True, blank=True)  # upstream server slugs the permit would cover; null: any
    max_credits = models.DecimalField(max_digits=20, decimal_places=8)
    max_calls = models.PositiveIntegerField(null=True, blank=True)
    permit_ttl_seconds = models.PositiveIntegerField()
    subject_key_id = models.CharField(max_length=40, null=True, blank=True)
    justification = models.TextField(blank=True, default="")
    status = models.CharField(max_length=16, choices=PermitRequestStatus.choices, default=PermitRequestStatus.PENDING)
    expires_at = models.DateTimeField()
    created_at = models.DateTimeField()
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decision_note = models.CharField(max_length=500, blank=True, default="")
    permit = models.OneToOneField(
        Permit, null=True, blank=True, on_delete=models.PROTECT, db_constraint=False, related_name="minted_from_request"
    )
    idempotency_scope = models.CharField(max_length=64)
    idempotency_key = models.CharField(max_length=255)
    request_hash = models.CharField(max_length=64)

    class Meta:
        db_table = "permits_permit_request"
        constraints = [
            models.UniqueConstraint(
                fields=["idempotency_scope", "idempotency_key", "tenant_id"], name="permit_request_idempotency_unique"
            ),
            models.CheckConstraint(
                condition=Q(status="approved", permit__isnull=False) | (~Q(status="approved") & Q(permit__isnull=True)),
                name="permit_request_approved_has_permit",
            ),
        ]
        indexes = [models.Index(fields=["tenant_id", "status", "created_at"], name="preq_tenant_status")]

    def __str__(self) -> str:
        return f"{self.request_id} ({self.status})"


class PermitApprovalDecision(models.TextChoices):
    APPROVED = "approved"
    REJECTED = "rejected"


class PermitApproval(models.Model):
    """A person's decision on a permit request as a signed statement (type ``permit_approval``).

    Written once, in the deciding transaction, never changed. The statement names the request, the
    tenant and wallet, the decision, the approver (user id and username), the decision time and, for an
    approval, the permit minted and the digest of the terms it is minted with
    (``audit.evidence_core.permit_terms_digest``); the permit's own statement names this approval.
    Every column equals what was signed: a permit counts as approved only when this row's signature
    verifies and its statement matches the permit's (docs/decisions.md, Authority, "Approvals are signed").
    """

    approval_id = models.CharField(max_length=40, primary_key=True)
    tenant_id = models.CharField(max_length=40, db_index=True)
    permit_request = models.OneToOneField(
        PermitRequest, on_delete=models.PROTECT, db_constraint=False, related_name="approval"
    )
    wallet_id = models.CharField(max_length=40)
    decision = models.CharField(max_length=16, choices=PermitApprovalDecision.choices)
    approver_user_id = models.BigIntegerField()
    approver = models.CharField(max_length=150, help_text="The approver's username when deciding.")
    decided_at = models.DateTimeField()
    permit_id = models.CharField(max_length=40, null=True, blank=True)
    terms_digest = models.CharField(max_length=64, null=True, blank=True)
    signed_statement = models.JSONField()
    signature = models.CharField(max_length=200)
    key_id = models.CharField(max_length=40, help_text="Evidence signing key (kid) that signed this decision.")

    class Meta:
        db_table = "permits_permit_approval"

    def __str__(self) -> str:
        return f"{self.approval_id} {self.decision} {self.permit_request_id}"


class TenantApprover(models.Model):
    """Membership: this Django user may approve permit requests of this tenant (root sponsor)."""

    # PROTECT: an approver leaves through ``tenant_approver_remove`` (audited), never with its user.
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="approver_of")
    tenant = models.ForeignKey(
        Wallet,
        on_delete=models.CASCADE,
        db_constraint=False,
        related_name="approvers",
        limit_choices_to={"wallet_type": "sponsor"},
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "permits_tenant_approver"
        constraints = [models.UniqueConstraint(fields=["user", "tenant"], name="approver_unique")]

    def __str__(self) -> str:
        return f"{self.user} approves {self.tenant_id}"


class TenantNotification(models.Model):
    """How a tenant's approvers hear of a new permit request (docs/decisions.md, Human approval): email
    to each approver's address, a signed webhook, or both. Without a row, email only (as before).

    ``webhook_secret`` is write-only: set in the console, used to sign each delivery (HMAC-SHA256),
    never shown again, logged or audited (the audit event says only that it changed).
    """

    tenant = models.OneToOneField(
        Wallet,
        on_delete=models.CASCADE,
        primary_key=True,
        db_constraint=False,  # the composite (tenant_id, tenant_id) -> wallet key replaces it (common.shardkeys)
        related_name="approver_notification",
        limit_choices_to={"wallet_type": "sponsor"},
    )
    email_enabled = models.BooleanField(default=True)
    webhook_url = models.URLField(max_length=500, blank=True, default="")
    webhook_secret = models.CharField(max_length=200, blank=True, default="")
    webhook_secret_set_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "permits_tenant_notification"

    def __str__(self) -> str:
        return f"approver notification of {self.tenant_id}"


class WebhookDeliveryStatus(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


class WebhookDelivery(models.Model):
    """One webhook notification of a permit request, its attempts and its outcome.

    Written in the transaction that creates the request (so a crash after commit loses none), sent
    by ``manage.py deliver_webhooks`` (``make run`` runs it in a loop), retried with backoff until
    ``WEBHOOK_MAX_ATTEMPTS``. ``body`` holds the exact bytes signed and sent.
    """

    delivery_id = models.CharField(max_length=40, primary_key=True)
    tenant_id = models.CharField(max_length=40, db_index=True)
    permit_request = models.ForeignKey(
        PermitRequest, on_delete=models.CASCADE, db_constraint=False, related_name="webhook_deliveries"
    )
    url = models.URLField(max_length=500)
    body = models.TextField()
    status = models.CharField(
        max_length=16, choices=WebhookDeliveryStatus.choices, default=WebhookDeliveryStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "permits_webhook_delivery"
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="webhook_delivery_due")]
        verbose_name_plural = "webhook deliveries"

    def __str__(self) -> str:
        return f"{self.delivery_id} ({self.status})"


class QuoteStatus(models.TextChoices):
    ACTIVE = "active"
    CONSUMED = "consumed"
    EXPIRED = "expired"


class Quote(Lapsing, models.Model):
    """A signed, frozen price for one call of ``tool`` by ``wallet``; spendable once while active."""

    OPEN_STATUS = QuoteStatus.ACTIVE
    EXPIRED_STATUS = QuoteStatus.EXPIRED

    quote_id = models.CharField(max_length=40, primary_key=True)
    tenant_id = models.CharField(max_length=40, db_index=True)
    wallet = models.ForeignKey(Wallet, on_delete=models.PROTECT, db_constraint=False, related_name="quotes")
    tool = models.CharField(max_length=200)
    quoted_credits = models.DecimalField(max_digits=20, decimal_places=8)
    status = models.CharField(max_length=16, choices=QuoteStatus.choices, default=QuoteStatus.ACTIVE)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    consumed_at = models.DateTimeField(null=True, blank=True)
    consumed_by = models.CharField(max_length=40, blank=True, default="", help_text="Action id that spent it.")
    requested_by_key_id = models.CharField(max_length=40, blank=True, default="")
    signed_statement = models.JSONField()
    signature = models.CharField(max_length=200)
    key_id = models.CharField(max_length=40)

    class Meta:
        db_table = "permits_quote"
        constraints = [
            models.CheckConstraint(
                condition=Q(status="consumed", consumed_at__isnull=False) | ~Q(status="consumed"),
                name="quote_consumed_has_time",
            ),
        ]
        indexes = [models.Index(fields=["wallet", "status", "expires_at"], name="quote_wallet_status")]

    def __str__(self) -> str:
        return f"{self.quote_id} {self.tool} {self.quoted_credits}"


# The one list of a policy bundle's rule fields, in the order they are shown: the services write these
# (``permits.services.policies``), the API answers them (``PolicyBundleResponse``) and audits snapshot them.
POLICY_FIELDS = (
    "name",
    "enabled",
    "allowed_tools",
    "denied_tools",
    "max_credits_per_call",
    "max_daily_credits",
    "allowed_categories",
    "allowed_servers",
    "human_approval_required",
)


class PolicyBundle(models.Model):
    """Rules that apply to calls made by ``wallet`` and every wallet below it.

    Rules: ``allowed_tools`` (null: any), ``denied_tools``, ``max_credits_per_call``,
    ``max_daily_credits``, ``allowed_categories`` (null: any), ``allowed_servers`` (upstream server
    slugs; null: any) and
    ``human_approval_required`` (permits for the covered wallets come only from
    human-approved permit requests or the operator; turning it on revokes the others).
    """

    policy_id = models.CharField(max_length=40, primary_key=True)
    tenant_id = models.CharField(max_length=40, db_index=True)
    wallet = models.ForeignKey(Wallet, on_delete=models.PROTECT, db_constraint=False, related_name="policies")
    name = models.CharField(max_length=200, blank=True, default="")
    enabled = models.BooleanField(default=True)
    allowed_tools = models.JSONField(null=True, blank=True)
    denied_tools = models.JSONField(default=list, blank=True)
    max_credits_per_call = models.DecimalField(max_digits=20, decimal_places=8, null=True, blank=True)
    max_daily_credits = models.DecimalField(max_digits=20, decimal_places=8, null=True, blank=True)
    allowed_categories = models.JSONField(null=True, blank=True)
    allowed_servers = models.JSONField(null=True, blank=True)  # upstream server slugs; null: any server
    human_approval_required = models.BooleanField(default=False)
    # Not a column: the permits the last ``policy_create`` / ``policy_update`` on this instance revoked
    # because the policy started requiring human approval (the console reports them).
    permits_revoked: tuple[str, ...] = ()
    version = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    created_by_key_id = models.CharField(max_length=40, blank=True, default="")
    # The wallet of the key that created the policy; empty when the operator (an operator
    # key or the console) set it.
    created_by_wallet_id = models.CharField(max_length=40, blank=True, default="")
    # The level the policy's rules were last set at: the creator's wallet, then the wallet of any
    # key that changed it (the creator's or one above it), empty once the operator changed it.
    # Decides who may change it (``policy_for_change``): a rule changed from above stays there.
    authority_wallet_id = models.CharField(max_length=40, blank=True, default="")

    class Meta:
        db_table = "permits_policy_bundle"
        indexes = [models.Index(fields=["tenant_id", "wallet"], name="policy_tenant_wallet")]

    def __str__(self) -> str:
        return f"{self.policy_id} {self.name}"


class ProposalStatus(models.TextChoices):
    PENDING = "pending"
    CONFIRMED = "confirmed"
    REJECTED = "rejected"
    EXPIRED = "expired"
    SUPERSEDED = "superseded"


class PolicyChangeProposal(Lapsing, models.Model):
    """A change to a policy bundle that relaxes human approval, waiting for a second person.

    ``policy_change`` records it instead of applying the change; it takes effect only when a
    console user holding ``confirm_policy_relaxation`` who is not the proposer (nor a console user
    who minted the proposing key's line) confirms it before ``expires_at``, and only while the
    policy is still at ``policy_version`` (``policy_proposal_confirm``). ``changes`` holds the
    rules that change (JSON: credits as strings), ``before`` their values when it was proposed.
    ``status`` stores pending, confirmed, rejected or superseded (a later change to the policy);
    ``expired`` is derived from the clock (:meth:`effective_status`).
    """

    OPEN_STATUS = ProposalStatus.PENDING
    EXPIRED_STATUS = ProposalStatus.EXPIRED

    proposal_id = models.CharField(max_length=40, primary_key=True)
    tenant_id = models.CharField(max_length=40, db_index=True)
    policy = models.ForeignKey(
        PolicyBundle, on_delete=models.PROTECT, db_constraint=False, related_name="change_proposals"
    )
    changes = models.JSONField()
    before = models.JSONField()
    relaxes = models.JSONField(help_text="The rules whose change relaxes human approval.")
    policy_version = models.PositiveIntegerField()
    proposed_by = models.CharField(max_length=200, help_text="admin:<username>, or the proposing API key.")
    proposed_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    proposed_by_key_id = models.CharField(max_length=40, blank=True, default="")
    proposer_wallet_id = models.CharField(max_length=40, blank=True, default="")
    # Usernames that may not confirm: the proposer, and the console users who minted the proposing
    # key or a key above it in its line (read from the audit chain when the proposal is made).
    excluded_confirmers = models.JSONField(default=list)
    status = models.CharField(max_length=16, choices=ProposalStatus.choices, default=ProposalStatus.PENDING)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )

    class Meta:
        db_table = "permits_policy_change_proposal"
        permissions = [
            ("confirm_policy_relaxation", "Can confirm or reject a proposal relaxing human approval"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=["pending", "superseded"]) | Q(decided_by__isnull=False),
                name="policy_proposal_decided_by_someone",
            ),
            models.CheckConstraint(
                condition=Q(proposed_by_user__isnull=False) | ~Q(proposed_by_key_id=""),
                name="policy_proposal_has_a_proposer",
            ),
        ]
        indexes = [models.Index(fields=["policy", "status"], name="policy_proposal_policy_status")]

    def __str__(self) -> str:
        return f"{self.proposal_id} for {self.policy_id} ({self.status})"
