"""API keys: creation (a key's secret is shown once), rotation and revocation, which takes the
keys a revoked key minted with it (its lineage), and the operator's keys.

A key's wallet is billing's: the services take it as a ``KeyWallet`` and lock it, refuse a closed
one and read its subtree through billing's registered ``WalletDirectory`` (``access.wallets``).

Every service owns its transaction (``@transaction.atomic(durable=True)``) and writes its audit
events inside it, as the last statements.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from access.exceptions import AncestorKeyRotation, APIKeyLimitReached
from access.keys import hash_secret, make_secret
from access.models import APIKey, APIKeyStatus, KeyLogAction, KeyRotationLog
from access.wallets import KeyWallet, wallet_directory
from audit.services import alert_raise, audit_record
from common.errors import NotFound
from common.ids import new_id


@dataclass(frozen=True)
class IssuedKey:
    """A key together with its secret, which exists only in this object and the one response."""

    key: APIKey
    secret: str


def _new_key(*, wallet: KeyWallet | None, name: str, rotated_from: str = "", actor_key_id: str = "") -> IssuedKey:
    key_id = new_id("key")
    secret = make_secret(key_id)
    key = APIKey.objects.create(
        key_id=key_id,
        wallet_id=wallet.wallet_id if wallet else None,
        tenant_id=wallet.tenant_id if wallet else None,
        name=name,
        secret_hash=hash_secret(secret),
        secret_last4=secret[-4:],
        rotated_from=rotated_from,
        created_by_key_id=actor_key_id,
    )
    return IssuedKey(key=key, secret=secret)


def api_key_create(*, wallet: KeyWallet, name: str = "", actor_key_id: str = "", actor: str = "") -> IssuedKey:
    """Create a wallet-scoped key (``_api_key_create``), or refuse one beyond ``API_KEYS_PER_WALLET``
    active keys (409 ``api_key_limit_reached``), the refusal audited (``api_key.limit_reached``) in a
    transaction of its own, since the refused one rolls back. The API and the console both come here.
    """
    try:
        return _api_key_create(wallet=wallet, name=name, actor_key_id=actor_key_id, actor=actor)
    except APIKeyLimitReached as refused:
        _audit_key_limit(refused, wallet, actor_key_id=actor_key_id, actor=actor, endpoint="/v1/api-keys")
        raise


@transaction.atomic(durable=True)
def _api_key_create(*, wallet: KeyWallet, name: str, actor_key_id: str, actor: str) -> IssuedKey:
    """Create a wallet-scoped key. The secret is returned once and only its hash is stored.

    ``actor_key_id`` (the minting key) is recorded as the new key's creator: revoking the
    creator revokes the new key too (``_revoke_lineage``). The creator's row is locked
    and re-checked here, so a key minted while its creator is being revoked either
    commits first (and is then found by the revocation) or is refused (401). A closed
    wallet gets no new key (403 ``wallet_closed``, read under the wallet's row lock, which
    closing takes too); a frozen or expired one does (see ``_require_open_wallet``). The wallet's
    active keys are counted under that lock (``_require_key_room``).
    """
    _require_open_wallet(_lock_wallet(wallet))
    _require_key_room(wallet)
    _require_active_minter(actor_key_id)
    issued = _new_key(wallet=wallet, name=name, actor_key_id=actor_key_id)
    KeyRotationLog.objects.create(
        wallet_id=wallet.wallet_id,
        tenant_id=wallet.tenant_id,
        action=KeyLogAction.CREATED,
        key_id=issued.key.key_id,
        actor_key_id=actor_key_id,
    )
    _key_audit(
        "created",
        wallet=wallet,
        actor_key_id=actor_key_id,
        endpoint="/v1/api-keys",
        actor=actor,
        new_key_id=issued.key.key_id,
    )
    return issued


@transaction.atomic(durable=True)
def operator_key_create(*, name: str = "operator", actor: str = "") -> IssuedKey:
    """Create an operator key (no wallet). Only ``manage.py`` and the admin console call this."""
    issued = _new_key(wallet=None, name=name)
    _key_audit("operator_created", actor=actor, new_key_id=issued.key.key_id)
    return issued


@transaction.atomic(durable=True)
def operator_key_revoke(*, key_id: str, reason: str = "operator_console", actor: str = "") -> APIKey:
    """Revoke an operator key (the console), audited on the system chain. Revoking a revoked key changes nothing."""
    key = APIKey.objects.select_for_update(no_key=True).filter(key_id=key_id, wallet_id__isnull=True).first()
    if key is None:
        raise NotFound("No such operator key.", key_id=key_id)
    if _revoke(key, reason):
        _key_audit("operator_revoked", actor=actor, revoked_key_id=key.key_id, reason=reason)
    return key


def _lock_wallet(wallet: KeyWallet) -> KeyWallet:
    """Lock the wallet's row (the lock closing and emergency revocation take) and return its current state."""
    locked = wallet_directory().lock(wallet.wallet_id)
    if locked is None:
        raise NotFound("No such wallet.", wallet_id=wallet.wallet_id)
    return locked


def _require_open_wallet(wallet: KeyWallet) -> None:
    """No key is minted for a closed wallet (403 ``wallet_closed``): billing's rule, through its directory."""
    wallet_directory().require_open(wallet)


def _require_key_room(wallet: KeyWallet, *, freed: int = 0) -> None:
    """Refuse a new key when the wallet holds ``API_KEYS_PER_WALLET`` active keys, not counting the
    ``freed`` ones the same transaction revokes (409 ``api_key_limit_reached``).

    Caller holds the wallet's row lock, which every creation and rotation of a key of the wallet
    takes first, so two creations cannot both see room for one key (a revocation only frees room).
    """
    limit = settings.API_KEYS_PER_WALLET
    active = APIKey.objects.filter(wallet_id=wallet.wallet_id, status=APIKeyStatus.ACTIVE).count()
    if active - freed >= limit:
        raise APIKeyLimitReached(wallet_id=wallet.wallet_id, limit=limit, active_keys=active)


def _audit_key_limit(
    refused: APIKeyLimitReached, wallet: KeyWallet, *, actor_key_id: str, actor: str, endpoint: str | None
) -> None:
    """The refusal of a key beyond the cap, on the wallet's chain (its own transaction: the refused one rolled back)."""
    _key_audit(
        "limit_reached",
        ok=False,
        wallet=wallet,
        actor_key_id=actor_key_id,
        endpoint=endpoint,
        actor=actor,
        limit=refused.extra["limit"],
        active_keys=refused.extra["active_keys"],
    )


def _lock_key(wallet: KeyWallet, key_id: str) -> APIKey:
    key = APIKey.objects.select_for_update(no_key=True).filter(key_id=key_id, wallet_id=wallet.wallet_id).first()
    if key is None:
        raise NotFound("No such API key in this wallet.", key_id=key_id)
    return key


def _require_active_minter(actor_key_id: str) -> None:
    """The key minting another must still be active (its row locked against a concurrent revocation)."""
    if not actor_key_id:
        return
    minter = APIKey.objects.select_for_update(no_key=True).filter(key_id=actor_key_id).first()
    if minter is not None and minter.status != APIKeyStatus.ACTIVE:
        from common.errors import InvalidAPIKey

        raise InvalidAPIKey(key_id=actor_key_id)


# Whether %(key)s descends from %(ancestor)s: the keys above %(key)s are its minter (created_by_key_id), the key
# it replaced (rotated_from), theirs, and so on up; LINEAGE_SQL's relation, read upwards.
DESCENDS_SQL = """
WITH RECURSIVE ancestry(key_id) AS (
    SELECT k.created_by_key_id FROM billing_api_key AS k WHERE k.key_id = %(key)s
    UNION
    SELECT k.rotated_from FROM billing_api_key AS k WHERE k.key_id = %(key)s
    UNION
    SELECT parent.key_id FROM billing_api_key AS k
      JOIN ancestry AS a ON k.key_id = a.key_id
      JOIN billing_api_key AS parent ON parent.key_id = k.created_by_key_id OR parent.key_id = k.rotated_from
)
SELECT EXISTS (SELECT 1 FROM ancestry WHERE key_id = %(ancestor)s)
"""


def _descends_from(key_id: str, ancestor_id: str) -> bool:
    """Whether ``key_id`` is in ``ancestor_id``'s lineage (revoking ``ancestor_id`` revokes it).

    A key's minter and predecessor are written when it is created and never change, and a key
    that authenticates committed after them, so one read answers for good.
    """
    if not key_id or key_id == ancestor_id:
        return False
    with connection.cursor() as cursor:
        cursor.execute(DESCENDS_SQL, {"key": key_id, "ancestor": ancestor_id})
        row = cursor.fetchone()
    return bool(row and row[0])


LINEAGE_SQL = """
WITH RECURSIVE lineage(key_id) AS (
    SELECT k.key_id FROM billing_api_key AS k
     WHERE (k.created_by_key_id = ANY(%(roots)s) OR k.rotated_from = ANY(%(roots)s))
       AND NOT k.key_id = ANY(%(exclude)s)
    UNION
    SELECT k.key_id FROM billing_api_key AS k
      JOIN lineage AS l ON k.created_by_key_id = l.key_id OR k.rotated_from = l.key_id
     WHERE NOT k.key_id = ANY(%(exclude)s)
)
SELECT key_id FROM lineage
"""


def _revoke_lineage(*, roots: list[APIKey], reason: str, actor_key_id: str, exclude: tuple[str, ...] = ()) -> list[str]:
    """Revoke every active key minted, directly or transitively, by the wallet keys in ``roots``.

    A key's lineage follows who minted it (``created_by_key_id``) and what it replaced
    (``rotated_from``), so an agent cannot outlive its own revocation by minting or
    rotating keys first. Keys minted by an operator key or the console start a lineage
    of their own (revoking an operator key does not revoke the tenants it provisioned).
    ``exclude`` keeps a rotation's successor. Each revocation is logged in its wallet's
    key log (reason ``lineage: ...``), alerted and audited. Caller holds the transaction.
    """
    wallet_roots = [key.key_id for key in roots if key.wallet_id is not None]
    if not wallet_roots:
        return []
    revoked: list[str] = []
    while True:
        # Each pass reads the lineage afresh: a key minted or rotated by one of it that committed while the
        # previous pass waited for a key's lock was not in that pass's snapshot. A locked, revoked key mints
        # nothing more (the mint locks its minter and finds it revoked), so the passes end.
        keys = _active_lineage(wallet_roots, exclude)
        if not keys:
            return revoked
        revoked += _revoke_lineage_keys(keys, wallet_roots, reason=reason, actor_key_id=actor_key_id)


def _active_lineage(wallet_roots: list[str], exclude: tuple[str, ...]) -> list[APIKey]:
    """The active keys of ``wallet_roots``' lineage, locked (key id order)."""
    with connection.cursor() as cursor:
        cursor.execute(LINEAGE_SQL, {"roots": wallet_roots, "exclude": list(exclude)})
        lineage = [row[0] for row in cursor.fetchall()]
    return list(
        APIKey.objects.select_for_update(no_key=True, of=("self",))
        .filter(key_id__in=lineage, status=APIKeyStatus.ACTIVE)
        .order_by("key_id")
    )


def _revoke_lineage_keys(keys: list[APIKey], wallet_roots: list[str], *, reason: str, actor_key_id: str) -> list[str]:
    revoked = []
    for key in keys:
        cause = key.created_by_key_id if key.created_by_key_id in wallet_roots else key.rotated_from
        lineage_reason = f"lineage: minted under revoked key {cause or ', '.join(wallet_roots)} ({reason})"[:200]
        if not _revoke(key, lineage_reason):
            continue
        revoked.append(key.key_id)
        _record_revocation(
            key,
            reason=lineage_reason,
            actor_key_id=actor_key_id,
            message=f"API key {key.key_id} was revoked with the key that minted it.",
            endpoint="/v1/api-keys",
            created_by_key_id=key.created_by_key_id,
            rotated_from=key.rotated_from,
        )
    return revoked


def _record_revocation(
    key: APIKey,
    *,
    reason: str,
    actor_key_id: str,
    message: str,
    endpoint: str,
    actor: str = "",
    **detail: Any,
) -> None:
    """A key's revocation in its wallet's key log, an alert and an audit event. Caller holds the transaction.

    The key's own wallet and tenant ids are its wallet's (a key never changes wallet)."""
    wallet_id, tenant_id = str(key.wallet_id), str(key.tenant_id)
    KeyRotationLog.objects.create(
        wallet_id=wallet_id,
        tenant_id=tenant_id,
        action=KeyLogAction.REVOKED,
        key_id=key.key_id,
        reason=reason,
        actor_key_id=actor_key_id,
    )
    alert_raise(
        tenant_id=tenant_id,
        wallet_id=wallet_id,
        kind="api_key_revoked",
        message=message,
        detail={"key_id": key.key_id, "reason": reason},
    )
    _key_audit(
        "revoked",
        tenant_id=tenant_id,
        wallet_id=wallet_id,
        actor_key_id=actor_key_id,
        endpoint=endpoint,
        actor=actor,
        revoked_key_id=key.key_id,
        reason=reason,
        **detail,
    )


def _revoke(key: APIKey, reason: str) -> bool:
    if key.status == APIKeyStatus.REVOKED:
        return False
    key.status = APIKeyStatus.REVOKED
    key.revoked_at = timezone.now()
    key.revoke_reason = reason
    key.save(update_fields=["status", "revoked_at", "revoke_reason"])
    return True


def api_key_rotate(
    *,
    wallet: KeyWallet,
    key_id: str,
    revoke_old: bool = True,
    reason: str = "rotation",
    actor_key_id: str = "",
    actor: str = "",
) -> IssuedKey:
    """Rotate ``key_id`` (``_api_key_rotate``). A rotation that revokes the old key leaves the count of
    active keys as it was, so it works at ``API_KEYS_PER_WALLET``; one that keeps the old key adds one and
    is refused there (409 ``api_key_limit_reached``, audited as ``api_key_create`` audits it).
    """
    try:
        return _api_key_rotate(
            wallet=wallet, key_id=key_id, revoke_old=revoke_old, reason=reason, actor_key_id=actor_key_id, actor=actor
        )
    except APIKeyLimitReached as refused:
        _audit_key_limit(
            refused, wallet, actor_key_id=actor_key_id, actor=actor, endpoint=None if actor else "/v1/api-keys/rotate"
        )
        raise


@transaction.atomic(durable=True)
def _api_key_rotate(
    *, wallet: KeyWallet, key_id: str, revoke_old: bool, reason: str, actor_key_id: str, actor: str
) -> IssuedKey:
    """Create a successor for ``key_id``; optionally revoke the old key in the same transaction.

    The successor is minted by the acting key, which must not descend from ``key_id`` (403
    ``ancestor_key_rotation``): revoking the old key revokes its lineage, the actor with it, and
    the successor, spared as the rotation's own, would outlive the key that minted it. A key
    may rotate itself, keys it minted, and other keys of a wallet in its reach. A closed wallet
    gets no successor (403 ``wallet_closed``; revoking its keys stays open).
    """
    _require_open_wallet(_lock_wallet(wallet))
    old = _lock_key(wallet, key_id)
    if old.status != APIKeyStatus.ACTIVE:
        from common.errors import Conflict

        raise Conflict("A revoked key cannot be rotated.", key_id=key_id)
    if _descends_from(actor_key_id, old.key_id):
        raise AncestorKeyRotation(key_id=old.key_id)
    _require_key_room(wallet, freed=1 if revoke_old else 0)
    _require_active_minter(actor_key_id)
    issued = _new_key(wallet=wallet, name=old.name, rotated_from=old.key_id, actor_key_id=actor_key_id)
    if revoke_old:
        _revoke(old, reason)
        revoked = _revoke_lineage(roots=[old], reason=reason, actor_key_id=actor_key_id, exclude=(issued.key.key_id,))
        if actor_key_id in revoked:
            # A backstop to the check above (the lineage of a key that authenticates cannot change): the
            # successor is spared as the rotation's own, so its minter must have survived the revocation.
            raise AncestorKeyRotation(key_id=old.key_id)
    KeyRotationLog.objects.create(
        wallet_id=wallet.wallet_id,
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
    _key_audit(
        "rotated",
        wallet=wallet,
        actor_key_id=actor_key_id,
        endpoint=None if actor else "/v1/api-keys/rotate",  # the console passes its actor, the API its key
        actor=actor,
        old_key_id=old.key_id,
        new_key_id=issued.key.key_id,
        old_revoked=revoke_old,
        reason=reason,
    )
    return issued


@transaction.atomic(durable=True)
def api_key_revoke(
    *, wallet: KeyWallet, key_id: str, reason: str = "user_request", actor_key_id: str = "", actor: str = ""
) -> APIKey:
    """Revoke one key immediately and for good, with every key it minted (``_revoke_lineage``).

    Revoking a revoked key changes nothing but still sweeps its lineage, so a key that
    slipped through (minted by a key revoked before lineage was enforced) goes too.
    """
    key = _lock_key(wallet, key_id)
    revoked_now = _revoke(key, reason)
    _revoke_lineage(roots=[key], reason=reason, actor_key_id=actor_key_id)
    if revoked_now:
        _record_revocation(
            key,
            reason=reason,
            actor_key_id=actor_key_id,
            actor=actor,
            message=f"API key {key.key_id} was revoked ({reason}).",
            endpoint="/v1/api-keys/{wallet_id}/{key_id}",
        )
    return key


@transaction.atomic(durable=True)
def api_key_emergency_revoke(
    *, wallet: KeyWallet, reason: str = "emergency", actor_key_id: str = "", actor: str = ""
) -> list[str]:
    """Revoke every active key of ``wallet`` and of every wallet below it at once, with their lineage.

    Returns the ids revoked now. Holds the wallet row lock, which key creation also
    takes, and locks every key it revokes (a key minting concurrently waits on its own
    row), so no key created concurrently can survive the revocation.
    """
    _lock_wallet(wallet)
    subtree_ids = wallet_directory().subtree_ids(wallet)  # a subquery, read afresh by each statement
    revoked: list[str] = []
    while True:
        # Each pass reads the subtree afresh: a key rotated or created in it that committed while the previous
        # pass waited for a lock (its predecessor, found active, was then skipped as revoked) is caught by the
        # next one. The lineage starts from every key of the subtree, revoked ones included.
        keys = list(
            APIKey.objects.select_for_update(no_key=True, of=("self",))
            .filter(wallet_id__in=subtree_ids, tenant_id=wallet.tenant_id, status=APIKeyStatus.ACTIVE)
            .order_by("key_id")
        )
        now_revoked = [k for k in keys if _revoke(k, reason)]
        for key in now_revoked:
            KeyRotationLog.objects.create(
                wallet_id=str(key.wallet_id),
                tenant_id=wallet.tenant_id,
                action=KeyLogAction.EMERGENCY_REVOKED,
                key_id=key.key_id,
                reason=reason if key.wallet_id == wallet.wallet_id else f"{reason} (wallet {wallet.wallet_id})"[:200],
                actor_key_id=actor_key_id,
            )
        subtree = list(APIKey.objects.filter(wallet_id__in=subtree_ids, tenant_id=wallet.tenant_id))
        lineage = _revoke_lineage(roots=subtree, reason=reason, actor_key_id=actor_key_id)
        revoked += [key.key_id for key in now_revoked] + lineage
        if not keys and not lineage:
            break
    alert_raise(
        tenant_id=wallet.tenant_id,
        wallet_id=wallet.wallet_id,
        kind="api_keys_emergency_revoked",
        severity="critical",
        message=f"All {len(revoked)} active API keys of the wallet and the wallets below it were revoked ({reason}).",
        detail={"key_ids": revoked, "reason": reason},
    )
    _key_audit(
        "emergency_revoked",
        wallet=wallet,
        actor_key_id=actor_key_id,
        endpoint="/v1/api-keys/emergency-revoke",
        actor=actor,
        revoked_key_ids=revoked,
        reason=reason,
    )
    return revoked


def _key_audit(
    event: str,
    *,
    ok: bool = True,
    wallet: KeyWallet | None = None,
    tenant_id: str | None = None,
    wallet_id: str | None = None,
    actor_key_id: str = "",
    endpoint: str | None = None,
    actor: str = "",
    **detail: Any,
) -> None:
    """Audit ``api_key.<event>`` on the chain of the key's tenant (``wallet``'s, or ``tenant_id``; the system
    chain for an operator key): the acting key as ``key_id``, the console's ``actor`` in the detail."""
    if wallet is not None:
        tenant_id, wallet_id = wallet.tenant_id, wallet.wallet_id
    audit_record(
        event=f"api_key.{event}",
        ok=ok,
        tenant_id=tenant_id,
        wallet_id=wallet_id,
        key_id=actor_key_id or None,
        endpoint=endpoint,
        detail={**detail, **({"actor": actor} if actor else {})},
    )
