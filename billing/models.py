"""Wallets, the double-entry ledger, prices and API keys.

Wallets form the sponsor -> agent -> child hierarchy; ``tenant_id`` is the root
sponsor's id on every row. API keys are wallet-scoped (``wallet`` set) or
operator keys (``wallet`` null, created by ``manage.py`` or the admin only).

The ledger (docs/architecture.md, "Money") has one row per account movement. Every
movement is one ledger transaction (``transaction_id``) of two or more entries
whose amounts sum to zero; a deferred constraint trigger (migration 0003)
refuses to commit anything else, and another trigger makes entries immutable.
Accounts are the wallets plus two system accounts, ``mint`` (where operator
credits come from) and ``revenue`` (where charges go). System accounts have no
row and no stored balance: a stored balance would be one global hot row that
every charge of every tenant locks. Their balance is the sum of their entries,
and their entries carry the tenant of the movement, so revenue stays per tenant.
"""

from __future__ import annotations

from decimal import Decimal

from django.db import models
from django.db.models import F, Q
from django.utils import timezone

ZERO = Decimal("0")


class WalletType(models.TextChoices):
    SPONSOR = "sponsor"
    AGENT = "agent"
    CHILD = "child"


class WalletStatus(models.TextChoices):
    ACTIVE = "active"
    FROZEN = "frozen"
    EXPIRED = "expired"
    CLOSED = "closed"


WALLET_PREFIX = {WalletType.SPONSOR: "spn", WalletType.AGENT: "agt", WalletType.CHILD: "chd"}


class Wallet(models.Model):
    """A credit account. Sponsors are human-owned roots; agents and children are funded from their parent.

    ``balance`` always equals the sum of the wallet's ledger entries (kept by the
    ledger services under the wallet's row lock); the database refuses a
    negative balance.
    """

    wallet_id = models.CharField(max_length=40, primary_key=True)
    tenant_id = models.CharField(max_length=40, db_index=True)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, db_constraint=False, related_name="children"
    )
    wallet_type = models.CharField(max_length=16, choices=WalletType.choices)
    status = models.CharField(max_length=16, choices=WalletStatus.choices, default=WalletStatus.ACTIVE)
    # Ancestry from the root sponsor down to this wallet: "spn_x/agt_y/chd_z".
    path = models.CharField(max_length=200)
    name = models.CharField(max_length=200, blank=True, default="")
    balance = models.DecimalField(max_digits=20, decimal_places=8, default=ZERO)
    # Lifetime spend cap for agent and child wallets (null: none).
    budget = models.DecimalField(max_digits=20, decimal_places=8, null=True, blank=True)
    # Daily spend limit (null: none).
    daily_limit = models.DecimalField(max_digits=20, decimal_places=8, null=True, blank=True)
    # Auto-refill from the parent when the balance falls under the threshold.
    refill_threshold = models.DecimalField(max_digits=20, decimal_places=8, null=True, blank=True)
    refill_amount = models.DecimalField(max_digits=20, decimal_places=8, null=True, blank=True)
    # Lifetime net spend (charges minus refunds); for an agent wallet, of the wallet and every
    # wallet below it, since its budget bounds the subtree. The budget applies to it.
    total_spent = models.DecimalField(max_digits=20, decimal_places=8, default=ZERO)
    expires_at = models.DateTimeField(null=True, blank=True)
    frozen_reason = models.CharField(max_length=200, blank=True, default="")
    frozen_at = models.DateTimeField(null=True, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "billing_wallet"
        # Console permissions a superuser grants (docs/architecture.md, "Tenancy and authority"; the
        # groups in mcpgateway 0002).
        permissions = [
            ("provision_credits", "Can provision credits from mint to sponsor wallets"),
            ("fund_wallet", "Can fund wallets from their parent"),
            ("freeze_wallet", "Can freeze and unfreeze wallets"),
            ("close_wallet", "Can close wallets"),
            ("change_wallet_settings", "Can change wallet settings (name, budget, daily limit, auto-refill)"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(balance__gte=0), name="wallet_balance_non_negative"),
            models.CheckConstraint(condition=Q(total_spent__gte=0), name="wallet_total_spent_non_negative"),
            models.CheckConstraint(
                condition=Q(refill_threshold__isnull=True, refill_amount__isnull=True)
                | Q(refill_threshold__gte=0, refill_amount__gt=0),
                name="wallet_refill_consistent",
            ),
            models.CheckConstraint(
                condition=(
                    Q(wallet_type="sponsor", parent__isnull=True)
                    | (~Q(wallet_type="sponsor") & Q(parent__isnull=False))
                ),
                name="wallet_sponsor_is_root",
            ),
        ]
        indexes = [models.Index(fields=["tenant_id", "wallet_type"], name="wallet_tenant_type")]

    def __str__(self) -> str:
        return f"{self.wallet_id} ({self.wallet_type}{', ' + self.name if self.name else ''})"

    @property
    def ancestry(self) -> list[str]:
        """Wallet ids from the root sponsor down to this wallet, inclusive."""
        return self.path.split("/")

    @property
    def line_id(self) -> str:
        """The wallet whose per-wallet allowances this one shares (its line): itself, or for a child wallet its
        agent parent (children have no children). The rate limit and the pending permit requests count
        per line, so an agent cannot multiply them by making child wallets (docs/decisions.md)."""
        return str(self.parent_id) if self.wallet_type == WalletType.CHILD else self.wallet_id

    @property
    def is_expired(self) -> bool:
        return self.status == WalletStatus.EXPIRED or (
            self.expires_at is not None and self.expires_at <= timezone.now()
        )

    @property
    def effective_status(self) -> str:
        """The status as callers see it: an active wallet past its expiry reads as ``expired``."""
        if self.status == WalletStatus.ACTIVE and self.is_expired:
            return WalletStatus.EXPIRED
        return self.status

    @property
    def has_refill(self) -> bool:
        return self.parent_id is not None and self.refill_threshold is not None and self.refill_amount is not None


class ServiceCategory(models.TextChoices):
    """The ServiceCategory enumeration (tool categories and charge categories).

    ``compute`` (running code or models), ``data`` (datasets, lookups),
    ``search`` (web or index search), ``storage`` (reading and writing stored
    objects), ``messaging`` (email, chat, notifications), ``payments`` (moving
    money outside Tollgate), ``content`` (generating or transforming content),
    ``tooling`` (developer and utility tools), ``other`` (anything else; the
    default of a charge without a category).
    """

    COMPUTE = "compute"
    DATA = "data"
    SEARCH = "search"
    STORAGE = "storage"
    MESSAGING = "messaging"
    PAYMENTS = "payments"
    CONTENT = "content"
    TOOLING = "tooling"
    OTHER = "other"


# Prices a category has when the operator has not set one (the price list rows override them).
DEFAULT_CATEGORY_PRICES: dict[str, Decimal] = {
    ServiceCategory.COMPUTE: Decimal("1.00000000"),
    ServiceCategory.DATA: Decimal("0.50000000"),
    ServiceCategory.SEARCH: Decimal("0.25000000"),
    ServiceCategory.STORAGE: Decimal("0.10000000"),
    ServiceCategory.MESSAGING: Decimal("0.20000000"),
    ServiceCategory.PAYMENTS: Decimal("2.00000000"),
    ServiceCategory.CONTENT: Decimal("0.50000000"),
    ServiceCategory.TOOLING: Decimal("0.10000000"),
    ServiceCategory.OTHER: Decimal("1.00000000"),
}


class SystemAccount(models.TextChoices):
    """The two wallet-less ledger accounts."""

    MINT = "mint"
    REVENUE = "revenue"


class LedgerKind(models.TextChoices):
    """What a ledger transaction does.

    ``provision``: mint -> sponsor. ``fund``: parent -> child. ``charge``:
    wallet -> revenue. ``refund``: revenue -> wallet. ``refill``: parent ->
    child, automatically, when a debit takes the child under its refill
    threshold. ``return``: a closing wallet's remaining balance back to its
    parent (or to mint for a sponsor).
    """

    PROVISION = "provision"
    FUND = "fund"
    CHARGE = "charge"
    REFUND = "refund"
    REFILL = "refill"
    RETURN = "return"


# Kinds that count as spend (charges) or undo spend (refunds).
SPEND_KINDS = (LedgerKind.CHARGE, LedgerKind.REFUND)


class LedgerEntry(models.Model):
    """One side of a ledger transaction: an amount credited (+) or debited (-) to one account.

    ``account`` is the wallet id for wallet entries (then ``wallet`` is set) or
    ``mint``/``revenue`` for system entries (then ``wallet`` is null and
    ``balance_after`` is null: system accounts keep no running balance). A
    wallet's entries sum to its balance; all entries sum to zero. Immutable.
    """

    entry_id = models.CharField(max_length=40, primary_key=True)
    transaction_id = models.CharField(max_length=40)
    tenant_id = models.CharField(max_length=40)
    wallet = models.ForeignKey(
        Wallet,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        db_constraint=False,
        related_name="ledger_entries",
        db_index=False,
    )
    account = models.CharField(max_length=40)
    counterparty = models.CharField(max_length=40)
    kind = models.CharField(max_length=16, choices=LedgerKind.choices)
    amount = models.DecimalField(max_digits=20, decimal_places=8)
    balance_after = models.DecimalField(max_digits=20, decimal_places=8, null=True, blank=True)
    service_category = models.CharField(max_length=32, choices=ServiceCategory.choices, blank=True, default="")
    units = models.DecimalField(max_digits=20, decimal_places=8, null=True, blank=True)
    description = models.CharField(max_length=500, blank=True, default="")
    request_path = models.CharField(max_length=300, blank=True, default="")
    correlation_id = models.CharField(max_length=128, blank=True, default="")
    # A refund points at the charge it reverses.
    refund_of = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        db_constraint=False,
        related_name="refunds",
        db_index=False,
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "billing_ledger_entry"
        verbose_name_plural = "ledger entries"
        constraints = [
            models.CheckConstraint(
                condition=(
                    Q(wallet__isnull=True, account__in=["mint", "revenue"], balance_after__isnull=True)
                    | Q(wallet__isnull=False, account=F("wallet_id"), balance_after__gte=0)
                ),
                name="ledger_entry_account_consistent",
            ),
        ]
        indexes = [
            models.Index(fields=["wallet", "created_at"], name="ledger_wallet_created"),
            models.Index(
                fields=["wallet", "created_at"],
                condition=Q(kind__in=["charge", "refund"]),
                name="ledger_wallet_spend",
            ),
            models.Index(fields=["transaction_id"], name="ledger_transaction"),
            models.Index(fields=["tenant_id", "created_at"], name="ledger_tenant_created"),
            models.Index(fields=["account", "created_at"], name="ledger_account_created"),
            models.Index(fields=["refund_of"], condition=Q(refund_of__isnull=False), name="ledger_refund_of"),
        ]

    def __str__(self) -> str:
        return f"{self.entry_id} {self.kind} {self.account} {self.amount}"


class SpendBucket(models.Model):
    """Net spend counted against one wallet's windows in one clock hour (UTC).

    The spend controls read these counters instead of aggregating the ledger, so
    a debit costs the same whatever the history (docs/architecture.md, "Money"). A charge on
    a wallet adds its amount to the wallet's bucket and to the bucket of every
    agent ancestor (the subtree's spend counts against the ancestor's limits); a
    refund subtracts it again from the buckets of the charge's hour, never below
    zero. Written only by ``billing.services`` under the row locks of the wallets
    whose windows they are. Buckets older than a day and an hour are no longer
    read and may be deleted.
    """

    id = models.BigAutoField(primary_key=True)
    wallet = models.ForeignKey(Wallet, on_delete=models.CASCADE, db_constraint=False, related_name="+", db_index=False)
    tenant_id = models.CharField(max_length=40)
    hour = models.DateTimeField()
    amount = models.DecimalField(max_digits=20, decimal_places=8, default=ZERO)

    class Meta:
        db_table = "billing_spend_bucket"
        constraints = [
            models.UniqueConstraint(fields=["wallet", "hour", "tenant_id"], name="spend_bucket_wallet_hour"),
            models.CheckConstraint(condition=Q(amount__gte=0), name="spend_bucket_non_negative"),
        ]

    def __str__(self) -> str:
        return f"{self.wallet_id} {self.hour:%Y-%m-%dT%H} {self.amount}"


class IdempotencyStatus(models.TextChoices):
    IN_PROGRESS = "in_progress"
    DONE = "done"


class ChargeIdempotency(models.Model):
    """A charge's idempotency key, scoped by wallet, with the stored response for replay.

    Written in the same transaction as the debit it records (see
    ``billing.services.wallet_charge``), never in a cache.
    """

    wallet = models.ForeignKey(
        Wallet, on_delete=models.PROTECT, db_constraint=False, related_name="charge_keys", db_index=False
    )
    tenant_id = models.CharField(max_length=40)
    key = models.CharField(max_length=255)
    request_hash = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=IdempotencyStatus.choices, default=IdempotencyStatus.DONE)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_body = models.JSONField(null=True, blank=True)
    entry = models.ForeignKey(
        LedgerEntry, null=True, blank=True, on_delete=models.PROTECT, db_constraint=False, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "billing_charge_idempotency"
        verbose_name_plural = "charge idempotency keys"
        constraints = [
            models.UniqueConstraint(fields=["wallet", "key", "tenant_id"], name="charge_idempotency_wallet_key")
        ]

    def __str__(self) -> str:
        return f"{self.wallet_id}:{self.key}"


class ServicePrice(models.Model):
    """The price list per service category: credits per unit of a charge."""

    category = models.CharField(max_length=32, choices=ServiceCategory.choices, primary_key=True)
    credits_per_unit = models.DecimalField(max_digits=20, decimal_places=8)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "billing_service_price"
        ordering = ["category"]
        constraints = [models.CheckConstraint(condition=Q(credits_per_unit__gte=0), name="service_price_non_negative")]

    def __str__(self) -> str:
        return f"{self.category}: {self.credits_per_unit}"


class ToolPrice(models.Model):
    """The price of one call of a tool, by tool name. ``credits`` null means "price not set"."""

    tool = models.CharField(max_length=200, primary_key=True)
    credits = models.DecimalField(max_digits=20, decimal_places=8, null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "billing_tool_price"
        ordering = ["tool"]
        constraints = [
            models.CheckConstraint(
                condition=Q(credits__isnull=True) | Q(credits__gte=0), name="tool_price_non_negative"
            )
        ]

    def __str__(self) -> str:
        return f"{self.tool}: {self.credits if self.credits is not None else 'not set'}"


class ToolPriceChange(models.Model):
    """One change of a tool's price (set, changed or removed): who, when, the old and the new price.

    Written only by ``billing.services.prices`` in the transaction that changes the ``ToolPrice`` row
    (under its row lock), so the history and the price never disagree. ``old_credits`` null: the tool
    had no price; ``new_credits`` null: the price was removed (or unset).
    """

    id = models.BigAutoField(primary_key=True)
    tool = models.CharField(max_length=200)
    old_credits = models.DecimalField(max_digits=20, decimal_places=8, null=True, blank=True)
    new_credits = models.DecimalField(max_digits=20, decimal_places=8, null=True, blank=True)
    removed = models.BooleanField(default=False)
    actor = models.CharField(max_length=200, blank=True, default="")
    actor_key_id = models.CharField(max_length=40, blank=True, default="")
    changed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "billing_tool_price_change"
        ordering = ["-changed_at", "-id"]
        indexes = [models.Index(fields=["tool", "-changed_at"], name="tool_price_change_tool")]

    def __str__(self) -> str:
        return f"{self.tool}: {self.old_credits} -> {self.new_credits}"


class APIKeyStatus(models.TextChoices):
    ACTIVE = "active"
    REVOKED = "revoked"


class APIKey(models.Model):
    """An API key. Only the SHA-256 of the full secret is stored; the secret is shown once.

    Secret format: ``tg_<key_id>_<at least 32 random base62 characters>``.
    """

    key_id = models.CharField(max_length=40, primary_key=True)
    wallet = models.ForeignKey(
        Wallet, null=True, blank=True, on_delete=models.PROTECT, db_constraint=False, related_name="api_keys"
    )
    tenant_id = models.CharField(max_length=40, null=True, blank=True, db_index=True)
    name = models.CharField(max_length=200, blank=True, default="")
    secret_hash = models.CharField(max_length=64)
    secret_last4 = models.CharField(max_length=4)
    status = models.CharField(max_length=16, choices=APIKeyStatus.choices, default=APIKeyStatus.ACTIVE)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoke_reason = models.CharField(max_length=200, blank=True, default="")
    rotated_from = models.CharField(max_length=40, blank=True, default="")
    created_by_key_id = models.CharField(max_length=40, blank=True, default="")

    class Meta:
        db_table = "billing_api_key"
        # Console permissions a superuser grants (docs/architecture.md, "Tenancy and authority"; the
        # groups in mcpgateway 0002).
        permissions = [
            ("revoke_key", "Can revoke API keys"),
            ("create_operator_key", "Can create operator (full-access) API keys"),
        ]
        verbose_name = "API key"
        constraints = [
            models.CheckConstraint(
                condition=Q(status="active", revoked_at__isnull=True) | Q(status="revoked", revoked_at__isnull=False),
                name="api_key_revocation_consistent",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.key_id} ({'operator' if self.wallet_id is None else self.wallet_id})"

    @property
    def is_operator(self) -> bool:
        return self.wallet_id is None

    @property
    def masked(self) -> str:
        return f"tg_{self.key_id}_{'*' * 8}{self.secret_last4}"


class KeyLogAction(models.TextChoices):
    CREATED = "created"
    ROTATED = "rotated"
    REVOKED = "revoked"
    EMERGENCY_REVOKED = "emergency_revoked"


class KeyRotationLog(models.Model):
    """The lifecycle log of a wallet's API keys (creation, rotation, revocation)."""

    wallet = models.ForeignKey(Wallet, on_delete=models.PROTECT, db_constraint=False, related_name="key_logs")
    tenant_id = models.CharField(max_length=40, db_index=True)
    action = models.CharField(max_length=32, choices=KeyLogAction.choices)
    key_id = models.CharField(max_length=40)
    new_key_id = models.CharField(max_length=40, blank=True, default="")
    reason = models.CharField(max_length=200, blank=True, default="")
    actor_key_id = models.CharField(max_length=40, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "billing_key_rotation_log"
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.action} {self.key_id}"
