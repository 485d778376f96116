"""Test factories. Wallets and balances are made through the billing services, so every
balance has its ledger entries and audit events."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from access import services as key_services
from billing import services
from billing.models import Wallet, WalletType


def make_sponsor(name: str = "sponsor", balance: Decimal | int = 0, **controls: object) -> Wallet:
    """A sponsor wallet with ``balance`` credits provisioned from mint."""
    return services.wallet_create_sponsor(name=name, initial_credits=Decimal(balance), **controls)  # type: ignore[arg-type]


def make_wallet(parent: Wallet, name: str = "agent", balance: Decimal | int = 0, **controls: object) -> Wallet:
    """An agent (under a sponsor) or child (under an agent) wallet funded with ``balance`` from ``parent``.

    When the parent cannot cover it, the shortfall is provisioned to the sponsor and funded down first.
    """
    amount = Decimal(balance)
    parent.refresh_from_db()
    if parent.balance < amount:
        top_up(parent, amount - parent.balance)
    wallet = services.wallet_create_agent(parent=parent, name=name, initial_balance=amount, **controls)  # type: ignore[arg-type]
    parent.refresh_from_db()
    return wallet


def top_up(wallet: Wallet, amount: Decimal | int) -> None:
    """Make sure ``wallet`` holds at least ``amount`` more than it does, funding down from the sponsor."""
    amount = Decimal(amount)
    if wallet.wallet_type == WalletType.SPONSOR:
        services.wallet_provision(wallet=wallet, amount=amount)
        return
    assert wallet.parent is not None
    top_up(wallet.parent, amount)
    services.wallet_fund(source=wallet.parent, target=wallet, amount=amount)


def make_key(wallet: Wallet, name: str = "") -> key_services.IssuedKey:
    return key_services.api_key_create(wallet=wallet, name=name)


def make_operator_key() -> key_services.IssuedKey:
    return key_services.operator_key_create(name="test operator")


def relax_policy(policy_id: str, **changes: Any) -> object:
    """Relax a policy's human approval the way it is done: one console user proposes the change
    (``policy_change``), a second one holding ``permits.confirm_policy_relaxation`` confirms it."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    from common.ids import new_id
    from permits.services import policy_change, policy_proposal_confirm

    users = get_user_model().objects
    proposer = users.create_user(new_id("proposer"), is_staff=True)
    confirmer = users.create_user(new_id("confirmer"), is_staff=True)
    confirmer.user_permissions.add(Permission.objects.get(codename="confirm_policy_relaxation"))
    confirmer = users.get(pk=confirmer.pk)  # a fresh instance: no stale permission cache
    proposal = policy_change(
        policy_id=policy_id, actor=f"admin:{proposer.get_username()}", user=proposer, **changes
    ).proposal
    assert proposal is not None, "the change relaxes nothing"
    return policy_proposal_confirm(
        proposal_id=proposal.proposal_id, user=confirmer, actor=f"admin:{confirmer.get_username()}"
    )


def approved_permit(
    wallet: Wallet,
    *,
    approver: Any = None,
    allowed_tools: list[str] | None = None,
    max_credits: Decimal | int | str = 5,
    subject_key_id: str | None = None,
) -> Any:
    """A permit as a person's approval mints it: the wallet's permit request (``permit_request_create``)
    approved by ``approver`` (made an approver of the wallet's tenant when none is given) through
    ``permit_request_decide``, so its statement names a signed approval. Returns the permit."""
    from django.contrib.auth import get_user_model

    from common.ids import new_id
    from permits.models import TenantApprover
    from permits.services import permit_request_create, permit_request_decide

    if approver is None:
        approver = get_user_model().objects.create_user(new_id("approver"))
        TenantApprover.objects.create(user=approver, tenant_id=wallet.tenant_id)
    key = new_id("idem")
    preq = permit_request_create(
        wallet=wallet,
        requested_by_key_id="",
        allowed_tools=allowed_tools or ["*"],
        max_credits=Decimal(max_credits),
        max_calls=None,
        permit_ttl_seconds=3600,
        subject_key_id=subject_key_id,
        justification="",
        idempotency_scope=f"test:{wallet.wallet_id}",
        idempotency_key=key,
        request_hash=key,
    ).permit_request
    decided = permit_request_decide(request_id=preq.request_id, user=approver, approve=True)
    assert decided.permit is not None
    return decided.permit
