"""Audit writes. ``audit_record`` is the one way any app appends to an audit chain."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.canonical import canonical_bytes, sha256_hex
from audit.models import SYSTEM_CHAIN, Alert, AuditEvent, ChainHead
from config.ids import new_id
from config.middleware import get_request_id


def chain_hash(prev_hash: str, payload: dict[str, Any]) -> str:
    """SHA-256 over the previous hash (32 raw bytes) followed by the canonical event bytes."""
    return sha256_hex(bytes.fromhex(prev_hash) + canonical_bytes(payload))


def audit_record(
    *,
    event: str,
    ok: bool,
    tenant_id: str | None = None,
    wallet_id: str | None = None,
    key_id: str | None = None,
    tool: str | None = None,
    endpoint: str | None = None,
    policy_decision_id: str | None = None,
    request_id: str | None = None,
    detail: dict[str, Any] | None = None,
) -> AuditEvent:
    """Append one event to the tenant's chain (or the ``system`` chain without a tenant).

    Runs inside the caller's transaction when there is one, so the event
    commits exactly when the change it records commits. It locks the chain
    head row; call it as the last statement of the transaction so the lock is
    held only until commit. Concurrent appends to one chain serialize on that
    lock and can never fork the chain.
    """
    chain = tenant_id or SYSTEM_CHAIN
    with transaction.atomic():
        ChainHead.objects.bulk_create([ChainHead(chain=chain)], ignore_conflicts=True)
        head = ChainHead.objects.select_for_update().get(chain=chain)
        seq = head.seq + 1
        record = AuditEvent(
            event_id=new_id("evt"),
            chain=chain,
            seq=seq,
            event=event,
            tenant_id=tenant_id,
            wallet_id=wallet_id,
            key_id=key_id,
            tool=tool,
            endpoint=endpoint,
            policy_decision_id=policy_decision_id,
            request_id=request_id or get_request_id(),
            ok=ok,
            detail=detail or {},
            created_at=timezone.now(),
            prev_hash=head.head_hash,
        )
        record.hash = chain_hash(head.head_hash, record.canonical_payload())
        record.save(force_insert=True)
        head.seq = seq
        head.head_hash = record.hash
        head.save(update_fields=["seq", "head_hash", "updated_at"])
    return record


def alert_raise(
    *,
    tenant_id: str,
    wallet_id: str,
    kind: str,
    message: str,
    severity: str = "warning",
    detail: dict[str, Any] | None = None,
) -> Alert:
    """Record an alert for a wallet inside the caller's transaction."""
    return Alert.objects.create(
        alert_id=new_id("alr"),
        tenant_id=tenant_id,
        wallet_id=wallet_id,
        kind=kind,
        severity=severity,
        message=message,
        detail=detail or {},
    )
