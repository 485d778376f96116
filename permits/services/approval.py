"""Human approval: whether a wallet's line requires it for permits, the lock that orders issuing a
permit against a policy starting to require it, and revoking a permit (one way for every caller).

``permits`` issues and revokes through these; ``policies`` revokes, when a policy starts requiring
approval, the permits of its subtree that no human approved.
"""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.models import Q
from django.utils import timezone

from billing.models import Wallet
from permits.models import Permit, PermitStatus, PolicyBundle
from permits.services.approval_record import permit_approval_standing
from permits.services.rows import wallet_row_audit


def human_approval_required(wallet: Wallet) -> bool:
    """True when an enabled policy on the wallet or an ancestor requires human approval."""
    return PolicyBundle.objects.filter(
        wallet_id__in=wallet.ancestry, enabled=True, human_approval_required=True
    ).exists()


def requires_approval(policy: PolicyBundle) -> bool:
    return bool(policy.enabled and policy.human_approval_required)


# The lock class of ``approval_lock``: advisory-lock keys are (class, hashtext(tenant id)), the two-int
# form, so a lock is one tenant's and never collides with another class or with the one-bigint keys
# (the signing-key rotation's) (docs/scaling.md, "Advisory locks").
APPROVAL_LOCK_CLASS = 0x7E_A991


def approval_lock(tenant_id: str, *, shared: bool) -> None:
    """The tenant's lock between issuing a permit without approval (``shared``) and a policy starting to
    require approval (exclusive), held to the end of the caller's transaction. An issuer that got it
    first commits before the policy's revocation reads the permits; one that waited sees the policy."""
    function = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {function}(%s, hashtext(%s))", [APPROVAL_LOCK_CLASS, tenant_id])


def revoke_locked(
    permit: Permit, *, reason: str, endpoint: str, actor_key_id: str = "", actor: str = "", **detail: Any
) -> None:
    """Revoke ``permit`` (its row locked by the caller, in the caller's transaction), audited."""
    permit.status = PermitStatus.REVOKED
    permit.revoked_at = timezone.now()
    permit.revoke_reason = reason
    permit.save(update_fields=["status", "revoked_at", "revoke_reason"])
    wallet_row_audit(
        "permit.revoked",
        permit,
        key_id=actor_key_id or None,
        actor=actor,
        endpoint=endpoint,
        detail={"permit_id": permit.permit_id, "reason": reason, **detail},
    )


def revoke_unapproved(policy: PolicyBundle, *, actor_key_id: str, actor: str) -> list[str]:
    """Revoke the active permits below ``policy``'s wallet that no human approved: issued by a wallet's
    key, not through an approved permit request. They could not be issued now (``permit_issue``
    refuses them), so they do not outlive the rule either. Caller holds the transaction and the
    exclusive ``approval_lock``. Returns the permit ids revoked.

    Who stands behind a permit is read from its signed record (``permit_approval_standing``): the
    statement's issuer and the approval it names, which must hold; a statement that does not verify
    counts as unapproved. The columns (``issuer_wallet``, ``issued_via_request_id``) are not read.
    """
    path = Wallet.objects.filter(wallet_id=policy.wallet_id).values_list("path", flat=True).get()
    active = Permit.objects.select_for_update(no_key=True).filter(
        Q(wallet__path=path) | Q(wallet__path__startswith=f"{path}/"), status=PermitStatus.ACTIVE
    )
    unapproved = [permit for permit in active.order_by("permit_id") if permit_approval_standing(permit) == "unapproved"]
    for permit in unapproved:
        revoke_locked(
            permit,
            reason=f"human approval required by policy {policy.policy_id}",
            endpoint="/v1/policies",
            actor_key_id=actor_key_id,
            actor=actor,
            policy_id=policy.policy_id,
        )
    return [permit.permit_id for permit in unapproved]
