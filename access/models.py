"""Access models. ``LoginThrottle`` keeps its table (``billing_login_throttle``): it moved from billing
to access in state only (billing 0023, access 0001; docs/decisions.md, Foundation)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q


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
