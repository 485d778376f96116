"""Policy bundles: creating and changing them (each owns its transaction and is audited), and
whether the policies on a wallet's line require human approval for its permits.

A policy applies to the wallet it is attached to and every wallet below it. What authorization
reads of the policies, and how, is ``permits.services.authorization``.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db import transaction

from audit.services import audit_record
from billing.exceptions import money
from billing.models import Wallet
from config.ids import new_id
from permits.models import PolicyBundle
from permits.selectors import check_policy_level

POLICY_FIELDS = (
    "name",
    "enabled",
    "allowed_tools",
    "denied_tools",
    "max_credits_per_call",
    "max_daily_credits",
    "allowed_categories",
    "human_approval_required",
)


def _policy_snapshot(policy: PolicyBundle) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in POLICY_FIELDS:
        value = getattr(policy, name)
        out[name] = money(value) if isinstance(value, Decimal) else value
    return out


@transaction.atomic(durable=True)
def policy_create(
    *, wallet: Wallet, actor_key_id: str = "", actor_wallet_id: str = "", actor: str = "", **rules: Any
) -> PolicyBundle:
    """Attach a policy bundle to ``wallet``; it applies to the wallet and every wallet below it.

    ``actor_wallet_id`` is the wallet of the creating key (empty for the operator): it
    records the level the policy was set at, which decides who may change it later
    (``permits.selectors.policy_for_change``).
    """
    policy = PolicyBundle(
        policy_id=new_id("pol"),
        tenant_id=wallet.tenant_id,
        wallet=wallet,
        created_by_key_id=actor_key_id,
        created_by_wallet_id=actor_wallet_id,
        authority_wallet_id=actor_wallet_id,
        **{k: v for k, v in rules.items() if k in POLICY_FIELDS},
    )
    policy.save(force_insert=True)
    audit_record(
        event="policy.created",
        ok=True,
        tenant_id=wallet.tenant_id,
        wallet_id=wallet.wallet_id,
        key_id=actor_key_id or None,
        endpoint="/v1/policies",
        detail={
            "policy_id": policy.policy_id,
            "rules": _policy_snapshot(policy),
            **({"actor": actor} if actor else {}),
        },
    )
    return policy


@transaction.atomic(durable=True)
def policy_update(
    *, policy_id: str, actor_key_id: str = "", actor_wallet_id: str = "", actor: str = "", **changes: Any
) -> PolicyBundle:
    """Change some rules of a policy bundle; bumps its version. Locks the row first.

    ``actor_wallet_id`` is the wallet of the changing key (empty for the operator and the console),
    which the caller has checked may change it (``permits.selectors.policy_for_change``: the
    policy's level or above). The policy's level becomes the changer's: a sponsor that tightens a
    policy its agent set on itself takes it over, and the agent can no longer undo the change. The
    level is checked again on the locked row (403 ``policy_read_only``): a change from above that
    committed while this one waited for the lock stands.
    """
    policy = PolicyBundle.objects.select_for_update(no_key=True).get(policy_id=policy_id)
    if actor_wallet_id:
        check_policy_level(policy, actor_wallet_id)
    before = _policy_snapshot(policy)
    authority_before = policy.authority_wallet_id
    fields = [k for k in changes if k in POLICY_FIELDS]
    for name in fields:
        setattr(policy, name, changes[name])
    policy.authority_wallet_id = actor_wallet_id
    policy.version += 1
    policy.save(update_fields=[*fields, "authority_wallet_id", "version", "updated_at"])
    audit_record(
        event="policy.updated",
        ok=True,
        tenant_id=policy.tenant_id,
        wallet_id=policy.wallet_id,
        key_id=actor_key_id or None,
        endpoint="/v1/policies/{policy_id}",
        detail={
            "policy_id": policy.policy_id,
            "before": before,
            "after": _policy_snapshot(policy),
            **(
                {"authority_before": authority_before, "authority_after": policy.authority_wallet_id}
                if policy.authority_wallet_id != authority_before
                else {}
            ),
            **({"actor": actor} if actor else {}),
        },
    )
    return policy


def human_approval_required(wallet: Wallet) -> bool:
    """True when an enabled policy on the wallet or an ancestor requires human approval."""
    return PolicyBundle.objects.filter(
        wallet_id__in=wallet.ancestry, enabled=True, human_approval_required=True
    ).exists()
