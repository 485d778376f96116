"""Tamper evidence: hash-chained audit events and their chain heads."""

from __future__ import annotations

from django.db import models

GENESIS_HASH = "0" * 64
SYSTEM_CHAIN = "system"


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

    def __str__(self) -> str:
        return f"{self.chain}@{self.seq}"


class AuditEvent(models.Model):
    """One immutable audit event. ``hash = SHA-256(prev_hash || canonical(event))``.

    Immutability: there is no update or delete path in code or admin; the
    ``save`` guard refuses to overwrite an existing row.
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

    class Meta:
        db_table = "audit_event"
        constraints = [
            models.UniqueConstraint(fields=["chain", "seq"], name="audit_event_chain_seq_unique"),
        ]
        indexes = [
            models.Index(fields=["tenant_id", "created_at"], name="audit_tenant_created"),
            models.Index(fields=["event"], name="audit_event_name"),
            models.Index(fields=["wallet_id"], name="audit_wallet"),
            models.Index(fields=["request_id"], name="audit_request"),
            models.Index(fields=["created_at"], name="audit_created"),
        ]
        ordering = ["created_at", "seq"]

    def __str__(self) -> str:
        return f"{self.event_id} {self.event} ({self.chain}#{self.seq})"

    def save(self, *args: object, **kwargs: object) -> None:
        if not self._state.adding:
            raise RuntimeError("audit events are immutable")
        super().save(*args, **kwargs)  # type: ignore[arg-type]

    def canonical_payload(self) -> dict[str, object]:
        """The hashed content of this event (everything except ``prev_hash`` and ``hash``)."""
        return event_payload(
            event_id=self.event_id,
            chain=self.chain,
            seq=self.seq,
            event=self.event,
            tenant_id=self.tenant_id,
            wallet_id=self.wallet_id,
            key_id=self.key_id,
            tool=self.tool,
            endpoint=self.endpoint,
            policy_decision_id=self.policy_decision_id,
            request_id=self.request_id,
            ok=self.ok,
            detail=self.detail,
            created_at=self.created_at.isoformat().replace("+00:00", "Z"),
        )


def event_payload(**fields: object) -> dict[str, object]:
    return {"type": "audit_event", **fields}


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
