"""Tamper evidence: hash-chained audit events, their chain heads, signing keys and alerts."""

from __future__ import annotations

from typing import Any, NoReturn

from django.contrib.postgres.indexes import GinIndex, OpClass
from django.db import models
from django.db.models import F, Func, Q

from audit.evidence_core import GENESIS_HASH
from common.modelparts import WrittenOnce

SYSTEM_CHAIN = "system"

__all__ = ["GENESIS_HASH", "SYSTEM_CHAIN", "Alert", "AuditEvent", "ChainHead", "SigningKey"]


class ChainHead(models.Model):
    """The tip of one audit chain (one per tenant plus ``system``).

    Appends lock this row (``SELECT ... FOR UPDATE``) so that concurrent appends
    serialize and a chain can never fork.
    """

    chain = models.CharField(max_length=64, primary_key=True)
    seq = models.BigIntegerField(default=0)
    head_hash = models.CharField(max_length=64, default=GENESIS_HASH)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "audit_chain_head"
        permissions = [("verify_chain", "Can verify audit chains from the console (records the verdict)")]

    def __str__(self) -> str:
        return f"{self.chain}@{self.seq}"


class ChainVerificationRecord(models.Model):
    """The latest ``POST /v1/audit/verify-chain`` of one chain: when, what range, and its verdict.

    Kept apart from ``ChainHead`` so that recording a verification never waits on (or holds up)
    the appends that lock the head. Shown on the console's index page.
    """

    chain = models.CharField(max_length=64, primary_key=True)
    verified_at = models.DateTimeField()
    from_seq = models.BigIntegerField()
    to_seq = models.BigIntegerField()
    valid = models.BooleanField()
    reason = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        db_table = "audit_chain_verification"

    def __str__(self) -> str:
        return f"{self.chain} {'valid' if self.valid else self.reason} at {self.verified_at:%Y-%m-%d %H:%M}"


class AuditEventQuerySet(models.QuerySet["AuditEvent"]):
    """Audit events are append-only: bulk updates and deletes are refused."""

    def update(self, **kwargs: Any) -> NoReturn:
        raise RuntimeError("audit events are immutable")

    def delete(self) -> NoReturn:
        raise RuntimeError("audit events are immutable")


def detail_refs() -> Func:
    """``audit_detail_refs(detail)`` (audit/sql/audit_detail_refs.sql): the ids an event's detail names and its
    actor, the expression the search index ``audit_detail_refs_path_ops`` holds and the filters ask."""
    return Func(F("detail"), function="audit_detail_refs", output_field=models.JSONField())


class AuditEvent(WrittenOnce):
    """One immutable audit event. ``hash = SHA-256(prev_hash || canonical(event))``.

    Immutability: there is no update or delete path in code or admin; the
    ``save`` guard refuses to overwrite an existing row, the queryset refuses
    bulk updates and deletes, and a PostgreSQL trigger (migration 0002) refuses
    UPDATE and DELETE on the table. Tampering by someone who bypasses all three
    is what the hash chain and signed checkpoints detect.
    """

    event_id = models.CharField(max_length=40, primary_key=True)
    chain = models.CharField(max_length=64)
    seq = models.BigIntegerField()
    event = models.CharField(max_length=64)
    tenant_id = models.CharField(max_length=40, null=True, blank=True)
    wallet_id = models.CharField(max_length=40, null=True, blank=True)
    key_id = models.CharField(max_length=40, null=True, blank=True)
    tool = models.CharField(max_length=200, null=True, blank=True)
    endpoint = models.CharField(max_length=300, null=True, blank=True)
    policy_decision_id = models.CharField(max_length=40, null=True, blank=True)
    request_id = models.CharField(max_length=128, null=True, blank=True)
    ok = models.BooleanField()
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        db_table = "audit_event"
        constraints = [
            models.UniqueConstraint(fields=["chain", "seq"], name="audit_event_chain_seq_unique"),
        ]
        indexes = [
            models.Index(fields=["tenant_id", "created_at"], name="audit_tenant_created"),
            models.Index(fields=["event"], name="audit_event_name"),
            models.Index(fields=["request_id"], name="audit_request"),
            models.Index(fields=["created_at"], name="audit_created"),
            models.Index(fields=["wallet_id", "created_at"], name="audit_wallet_created"),
            # JSON containment on the ids the detail names (the actor and object_id filters, audit.selectors).
            GinIndex(OpClass(detail_refs(), name="jsonb_path_ops"), name="audit_detail_refs_path_ops"),
        ]
        ordering = ["created_at", "seq"]

    def __str__(self) -> str:
        return f"{self.event_id} {self.event} ({self.chain}#{self.seq})"

    def delete(self, *args: object, **kwargs: object) -> NoReturn:
        raise RuntimeError("audit events are immutable")


class SigningKeyState(models.TextChoices):
    ACTIVE = "active"
    RETIRED = "retired"


class SigningKey(models.Model):
    """Public metadata of an Ed25519 evidence signing key. The private key is never stored here.

    ``key_id`` is derived from the public key (``sig_`` + base62 of its
    SHA-256), so a key has the same id in the database, the key file and every
    signed statement. Exactly one key is active, enforced by a partial unique
    index; retired keys stay published so older statements keep verifying.
    """

    key_id = models.CharField(max_length=40, primary_key=True)
    algorithm = models.CharField(max_length=16, default="Ed25519")
    public_key = models.CharField(max_length=64, help_text="Raw 32-byte Ed25519 public key, unpadded base64url.")
    state = models.CharField(max_length=16, choices=SigningKeyState.choices, default=SigningKeyState.ACTIVE)
    created_at = models.DateTimeField()
    activated_at = models.DateTimeField(null=True, blank=True)
    retired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "audit_signing_key"
        constraints = [
            models.UniqueConstraint(
                fields=["state"], condition=Q(state="active"), name="signing_key_exactly_one_active"
            ),
            models.CheckConstraint(
                condition=Q(state="active", activated_at__isnull=False, retired_at__isnull=True)
                | Q(state="retired", retired_at__isnull=False),
                name="signing_key_state_consistent",
            ),
            models.CheckConstraint(condition=Q(algorithm="Ed25519"), name="signing_key_algorithm_ed25519"),
        ]

    def __str__(self) -> str:
        return f"{self.key_id} ({self.state})"


class AlertSeverity(models.TextChoices):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


class Alert(models.Model):
    """Something a wallet's owner should know about (key revoked, wallet frozen, delivery uncertain)."""

    alert_id = models.CharField(max_length=40, primary_key=True)
    tenant_id = models.CharField(max_length=40)
    wallet_id = models.CharField(max_length=40)
    kind = models.CharField(max_length=64)
    severity = models.CharField(max_length=16, choices=AlertSeverity.choices, default=AlertSeverity.WARNING)
    message = models.CharField(max_length=500)
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "audit_alert"
        indexes = [models.Index(fields=["wallet_id", "-created_at"], name="alert_wallet_created")]

    def __str__(self) -> str:
        return f"{self.kind} on {self.wallet_id}"
