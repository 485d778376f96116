"""Billing reads, each with the caller's permission scope applied."""

from __future__ import annotations

import hmac

from django.db.models import QuerySet

from billing.keys import MIN_SECRET_LENGTH, hash_secret, parse_secret
from billing.models import APIKey, APIKeyStatus, KeyRotationLog, Wallet
from config.authentication import Principal
from config.errors import InvalidAPIKey, NotFound, WalletAccessDenied


def api_key_authenticate(*, secret: str) -> APIKey:
    """The active key for a presented secret. Raises InvalidAPIKey (401) otherwise.

    Looks the key up by id and compares SHA-256 digests in constant time.
    """
    if len(secret) < MIN_SECRET_LENGTH:
        raise InvalidAPIKey("The API key is missing, malformed or too short.")
    key_id = parse_secret(secret)
    if key_id is None:
        raise InvalidAPIKey("The API key is malformed.")
    key = APIKey.objects.select_related("wallet").filter(key_id=key_id).first()
    if key is None or not hmac.compare_digest(key.secret_hash, hash_secret(secret)):
        raise InvalidAPIKey("The API key is not valid.")
    if key.status != APIKeyStatus.ACTIVE:
        raise InvalidAPIKey("The API key has been revoked.", key_id=key.key_id)
    return key


def wallet_in_reach(principal: Principal, wallet: Wallet) -> bool:
    """Operators reach every wallet; a wallet key reaches its own wallet and its descendants."""
    if principal.is_operator:
        return True
    return wallet.tenant_id == principal.tenant_id and principal.wallet_id in wallet.ancestry


def wallet_for_caller(principal: Principal, wallet_id: str, *, for_update: bool = False) -> Wallet:
    """The wallet addressed by ``wallet_id`` if the caller may act on it.

    Unknown wallet: 404 for operators; for wallet keys 403 ``wallet_access_denied``
    (the same answer as a wallet outside their reach, so existence does not leak).
    """
    qs = Wallet.objects.all()
    if for_update:
        qs = qs.select_for_update(of=("self",))
    wallet = qs.filter(wallet_id=wallet_id).first()
    if wallet is None:
        if principal.is_operator:
            raise NotFound("No such wallet.", wallet_id=wallet_id)
        raise WalletAccessDenied(wallet_id=wallet_id)
    if not wallet_in_reach(principal, wallet):
        raise WalletAccessDenied(wallet_id=wallet_id)
    return wallet


def wallets_visible(principal: Principal) -> QuerySet[Wallet]:
    """Wallets the caller may see: all for operators; own wallet and descendants for wallet keys."""
    qs = Wallet.objects.all()
    if principal.is_operator:
        return qs
    assert principal.wallet_id is not None
    own = principal.key.wallet
    assert own is not None
    return qs.filter(tenant_id=principal.tenant_id, path__startswith=own.path)


def api_keys_of_wallet(wallet: Wallet) -> QuerySet[APIKey]:
    return APIKey.objects.filter(wallet=wallet).order_by("-created_at", "key_id")


def key_logs_of_wallet(wallet: Wallet) -> QuerySet[KeyRotationLog]:
    return KeyRotationLog.objects.filter(wallet=wallet).order_by("-created_at", "-id")
