"""Billing writes: API keys (and, as billing grows, wallets and the ledger).

Every service owns its transaction and writes its audit event inside it, as the
last statement.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from audit.services import alert_raise, audit_record
from billing.keys import hash_secret, make_secret
from billing.models import APIKey, APIKeyStatus, KeyLogAction, KeyRotationLog, Wallet
from config.errors import NotFound
from config.ids import new_id


@dataclass(frozen=True)
class IssuedKey:
    """A key together with its secret, which exists only in this object and the one response."""

    key: APIKey
    secret: str


def _new_key(*, wallet: Wallet | None, name: str, rotated_from: str = "", actor_key_id: str = "") -> IssuedKey:
    key_id = new_id("key")
    secret = make_secret(key_id)
    key = APIKey.objects.create(
        key_id=key_id,
        wallet=wallet,
        tenant_id=wallet.tenant_id if wallet else None,
        name=name,
        secret_hash=hash_secret(secret),
        secret_last4=secret[-4:],
        rotated_from=rotated_from,
        created_by_key_id=actor_key_id,
    )
    return IssuedKey(key=key, secret=secret)


@transaction.atomic(durable=True)
def api_key_create(*, wallet: Wallet, name: str = "", actor_key_id: str = "") -> IssuedKey:
    """Create a wallet-scoped key. The secret is returned once and only its hash is stored."""
    _lock_wallet(wallet)
    issued = _new_key(wallet=wallet, name=name, actor_key_id=actor_key_id)
    KeyRotationLog.objects.create(
        wallet=wallet,
        tenant_id=wallet.tenant_id,
        action=KeyLogAction.CREATED,
        key_id=issued.key.key_id,
        actor_key_id=actor_key_id,
    )
    audit_record(
        event="api_key.created",
        ok=True,
        tenant_id=wallet.tenant_id,
        wallet_id=wallet.wallet_id,
        key_id=actor_key_id or None,
        endpoint="/v1/api-keys",
        detail={"new_key_id": issued.key.key_id},
    )
    return issued


@transaction.atomic(durable=True)
def operator_key_create(*, name: str = "operator") -> IssuedKey:
    """Create an operator key (no wallet). Only ``manage.py`` and the admin console call this."""
    issued = _new_key(wallet=None, name=name)
    audit_record(event="api_key.operator_created", ok=True, detail={"new_key_id": issued.key.key_id})
    return issued


def _lock_wallet(wallet: Wallet) -> None:
    Wallet.objects.select_for_update(of=("self",)).filter(wallet_id=wallet.wallet_id).first()


def _lock_key(wallet: Wallet, key_id: str) -> APIKey:
    key = APIKey.objects.select_for_update().filter(key_id=key_id, wallet=wallet).first()
    if key is None:
        raise NotFound("No such API key in this wallet.", key_id=key_id)
    return key


def _revoke(key: APIKey, reason: str) -> bool:
    if key.status == APIKeyStatus.REVOKED:
        return False
    key.status = APIKeyStatus.REVOKED
    key.revoked_at = timezone.now()
    key.revoke_reason = reason
    key.save(update_fields=["status", "revoked_at", "revoke_reason"])
    return True


@transaction.atomic(durable=True)
def api_key_rotate(
    *, wallet: Wallet, key_id: str, revoke_old: bool = True, reason: str = "rotation", actor_key_id: str = ""
) -> IssuedKey:
    """Create a successor for ``key_id``; optionally revoke the old key in the same transaction."""
    old = _lock_key(wallet, key_id)
    if old.status != APIKeyStatus.ACTIVE:
        from config.errors import Conflict

        raise Conflict("A revoked key cannot be rotated.", key_id=key_id)
    issued = _new_key(wallet=wallet, name=old.name, rotated_from=old.key_id, actor_key_id=actor_key_id)
    if revoke_old:
        _revoke(old, reason)
    KeyRotationLog.objects.create(
        wallet=wallet,
        tenant_id=wallet.tenant_id,
        action=KeyLogAction.ROTATED,
        key_id=old.key_id,
        new_key_id=issued.key.key_id,
        reason=reason,
        actor_key_id=actor_key_id,
    )
    if revoke_old:
        alert_raise(
            tenant_id=wallet.tenant_id,
            wallet_id=wallet.wallet_id,
            kind="api_key_revoked",
            severity="info",
            message=f"API key {old.key_id} was revoked by rotation to {issued.key.key_id}.",
            detail={"key_id": old.key_id, "new_key_id": issued.key.key_id, "reason": reason},
        )
    audit_record(
        event="api_key.rotated",
        ok=True,
        tenant_id=wallet.tenant_id,
        wallet_id=wallet.wallet_id,
        key_id=actor_key_id or None,
        endpoint="/v1/api-keys/rotate",
        detail={"old_key_id": old.key_id, "new_key_id": issued.key.key_id, "old_revoked": revoke_old},
    )
    return issued


@transaction.atomic(durable=True)
def api_key_revoke(*, wallet: Wallet, key_id: str, reason: str = "user_request", actor_key_id: str = "") -> APIKey:
    """Revoke one key immediately and for good. Revoking a revoked key changes nothing."""
    key = _lock_key(wallet, key_id)
    if _revoke(key, reason):
        KeyRotationLog.objects.create(
            wallet=wallet,
            tenant_id=wallet.tenant_id,
            action=KeyLogAction.REVOKED,
            key_id=key.key_id,
            reason=reason,
            actor_key_id=actor_key_id,
        )
        alert_raise(
            tenant_id=wallet.tenant_id,
            wallet_id=wallet.wallet_id,
            kind="api_key_revoked",
            message=f"API key {key.key_id} was revoked ({reason}).",
            detail={"key_id": key.key_id, "reason": reason},
        )
        audit_record(
            event="api_key.revoked",
            ok=True,
            tenant_id=wallet.tenant_id,
            wallet_id=wallet.wallet_id,
            key_id=actor_key_id or None,
            endpoint="/v1/api-keys/{wallet_id}/{key_id}",
            detail={"revoked_key_id": key.key_id, "reason": reason},
        )
    return key


@transaction.atomic(durable=True)
def api_key_emergency_revoke(*, wallet: Wallet, reason: str = "emergency", actor_key_id: str = "") -> list[str]:
    """Revoke every active key of ``wallet`` at once. Returns the ids revoked now.

    Holds the wallet row lock, which key creation also takes, so no key created
    concurrently can survive the revocation.
    """
    _lock_wallet(wallet)
    keys = list(APIKey.objects.select_for_update().filter(wallet=wallet, status=APIKeyStatus.ACTIVE).order_by("key_id"))
    revoked = [k.key_id for k in keys if _revoke(k, reason)]
    for key_id in revoked:
        KeyRotationLog.objects.create(
            wallet=wallet,
            tenant_id=wallet.tenant_id,
            action=KeyLogAction.EMERGENCY_REVOKED,
            key_id=key_id,
            reason=reason,
            actor_key_id=actor_key_id,
        )
    alert_raise(
        tenant_id=wallet.tenant_id,
        wallet_id=wallet.wallet_id,
        kind="api_keys_emergency_revoked",
        severity="critical",
        message=f"All {len(revoked)} active API keys of the wallet were revoked ({reason}).",
        detail={"key_ids": revoked, "reason": reason},
    )
    audit_record(
        event="api_key.emergency_revoked",
        ok=True,
        tenant_id=wallet.tenant_id,
        wallet_id=wallet.wallet_id,
        key_id=actor_key_id or None,
        endpoint="/v1/api-keys/emergency-revoke",
        detail={"revoked_key_ids": revoked, "reason": reason},
    )
    return revoked
