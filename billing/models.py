"""Wallets and API keys.

Wallets form the sponsor -> agent -> child hierarchy; ``tenant_id`` is the root
sponsor's id on every row. API keys are wallet-scoped (``wallet`` set) or
operator keys (``wallet`` null, created by ``manage.py`` or the admin only).
"""

from __future__ import annotations

from decimal import Decimal

from django.db import models
from django.db.models import Q

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
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="children")
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
    total_spent = models.DecimalField(max_digits=20, decimal_places=8, default=ZERO)
    expires_at = models.DateTimeField(null=True, blank=True)
    frozen_reason = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "billing_wallet"
        constraints = [
            models.CheckConstraint(condition=Q(balance__gte=0), name="wallet_balance_non_negative"),
            models.CheckConstraint(condition=Q(total_spent__gte=0), name="wallet_total_spent_non_negative"),
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


class APIKeyStatus(models.TextChoices):
    ACTIVE = "active"
    REVOKED = "revoked"


class APIKey(models.Model):
    """An API key. Only the SHA-256 of the full secret is stored; the secret is shown once.

    Secret format: ``tg_<key_id>_<at least 32 random base62 characters>``.
    """

    key_id = models.CharField(max_length=40, primary_key=True)
    wallet = models.ForeignKey(Wallet, null=True, blank=True, on_delete=models.PROTECT, related_name="api_keys")
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

    wallet = models.ForeignKey(Wallet, on_delete=models.PROTECT, related_name="key_logs")
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
