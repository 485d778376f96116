"""Access models: API keys and their lifecycle log, and sign-in throttles. Each keeps its table
(``billing_api_key``, ``billing_key_rotation_log``, ``billing_login_throttle``): they moved from
billing to access in state only (billing 0023 and 0028, access 0001 and 0002; docs/decisions.md,
Foundation). A key's wallet is billing's: a plain ``wallet_id`` here, read through
``access.wallets``."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from access.wallets import KeyWallet, wallet_directory


class LoginThrottleScope(models.TextChoices):
    CLIENT = "client", "account from one client"
    ACCOUNT = "account", "account from every client"
    ADDRESS = "address", "client, every account"


class LoginThrottle(models.Model):
    """Failed password sign-ins (console and approval pages) of one scope, and its lockout.

    One row per (scope, account, client): ``client`` scope is one account from one client address,
    ``account`` one account from every client (``client`` empty), ``address`` one client address
    for every account (``account_key`` empty). ``failures`` is a leaky bucket: it drains at the
    scope's hourly limit from ``updated_at``, so there is no window boundary to straddle. A failure
    that leaves no room for another locks the row until ``locked_until``, for the cool-off of
    ``level`` (the lockouts so far), which resets after a quiet period. Written only by
    ``access.login_throttle`` under the row lock (docs/decisions.md, Operator console).
    """

    scope = models.CharField(max_length=16, choices=LoginThrottleScope.choices)
    # "user:<pk>" where the account exists, else "name:<sha256 of the NFKC-casefolded username>".
    account_key = models.CharField(max_length=80, blank=True, default="")
    # What the console shows for the account: the user's username, or the normalized name typed.
    account_label = models.CharField(max_length=150, blank=True, default="")
    client = models.CharField(max_length=64, blank=True, default="")
    failures = models.FloatField(default=0)
    updated_at = models.DateTimeField()
    level = models.PositiveSmallIntegerField(default=0)
    locked_until = models.DateTimeField(null=True, blank=True, db_index=True)

    class Meta:
        db_table = "billing_login_throttle"
        verbose_name = "sign-in lockout"
        constraints = [
            models.UniqueConstraint(fields=["scope", "account_key", "client"], name="login_throttle_unique"),
            models.CheckConstraint(condition=Q(failures__gte=0), name="login_throttle_failures_nonnegative"),
        ]
        permissions = [("unlock_login", "Can unlock locked sign-ins")]

    def __str__(self) -> str:
        who = " from ".join(part for part in (self.account_label, self.client) if part)
        return f"{self.scope}: {who}"


class APIKeyStatus(models.TextChoices):
    ACTIVE = "active"
    REVOKED = "revoked"


class APIKey(models.Model):
    """An API key. Only the SHA-256 of the full secret is stored; the secret is shown once.

    Secret format: ``tg_<key_id>_<at least 32 random base62 characters>``.
    """

    key_id = models.CharField(max_length=40, primary_key=True)
    # The wallet (billing's; null for an operator key): a plain id here, as a link up the chain is
    # (docs/architecture.md, "The apps"); the database keeps the foreign key (wallet_id, tenant_id).
    wallet_id = models.CharField("wallet", max_length=40, null=True, blank=True, db_index=True, db_column="wallet_id")
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
    def wallet(self) -> KeyWallet | None:
        """The key's wallet (None for an operator key): the one the key lookup read with the key in
        the same statement (``access.selectors``), else read once through billing's registered
        ``WalletDirectory`` (``access.wallets``)."""
        if self.wallet_id is None:
            return None
        cached: KeyWallet | None = self.__dict__.get("_wallet")
        if cached is None or cached.wallet_id != self.wallet_id:
            cached = wallet_directory().get(self.wallet_id)
            self.__dict__["_wallet"] = cached
        return cached

    def wallet_attach(self, wallet: KeyWallet | None) -> None:
        """Keep ``wallet`` as the key's wallet (read with the key: no second query)."""
        self.__dict__["_wallet"] = wallet

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

    # A plain id, as on APIKey; the database keeps the foreign key (wallet_id, tenant_id).
    wallet_id = models.CharField("wallet", max_length=40, db_index=True, db_column="wallet_id")
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
