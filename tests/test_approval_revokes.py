"""A policy that starts requiring human approval revokes the permits no human approved.

While such a policy binds a wallet, no wallet key may issue it a permit (``human_approval_required``).
A permit an agent issued itself the minute before used to stay usable until it expired (up to 30
days), so turning approval on did not stop the agent. Now the policy's creation, or the change that
turns it on (``human_approval_required`` or ``enabled``), revokes every active permit of the
subtree issued by a wallet's key; permits from approved requests and from operators stay. An
issuance racing the change either commits first (and is revoked) or sees the policy (refused): the
tenant's approval lock orders them.
"""

from __future__ import annotations

import threading
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection

from audit.models import AuditEvent
from billing.models import Wallet
from common.ids import new_id
from permits import services
from permits.models import Permit, PermitStatus, PolicyBundle
from tests import factories
from tests.conftest import Tenant, client_for, make_tenant


def _issue(client: Any, wallet: Wallet) -> Any:
    return client.post(
        "/v1/permits",
        {"wallet_id": wallet.wallet_id, "allowed_tools": ["*"], "max_credits": "5"},
        format="json",
        HTTP_IDEMPOTENCY_KEY=new_id("pk"),
    )


def _approved(wallet: Wallet, sponsor: Wallet) -> Permit:
    """A permit as an approved permit request mints it (the tenant root issues it, its statement naming
    the signed approval)."""
    assert sponsor.wallet_id == wallet.tenant_id
    permit: Permit = factories.approved_permit(wallet)
    return permit


def _status(permit_id: str) -> str:
    return Permit.objects.get(permit_id=permit_id).status


@pytest.mark.django_db
def test_creating_the_policy_revokes_the_unapproved_permits_of_the_subtree(tenant: Tenant, operator_client: Any):
    child = factories.make_wallet(tenant.agent, "sub")
    own = _issue(tenant.agent_client, tenant.agent).json()["permit_id"]
    for_child = _issue(tenant.agent_client, child).json()["permit_id"]
    from_sponsor = _issue(tenant.sponsor_client, tenant.agent).json()["permit_id"]
    from_operator = _issue(operator_client, tenant.agent).json()["permit_id"]
    approved = _approved(tenant.agent, tenant.sponsor).permit_id
    elsewhere = make_tenant("other")
    untouched = _issue(elsewhere.agent_client, elsewhere.agent).json()["permit_id"]

    r = tenant.sponsor_client.post(
        "/v1/policies", {"wallet_id": tenant.agent.wallet_id, "human_approval_required": True}, format="json"
    )
    assert r.status_code == 201, r.content
    policy_id = r.json()["policy_id"]

    for permit_id in (own, for_child, from_sponsor):
        permit = Permit.objects.get(permit_id=permit_id)
        assert permit.status == PermitStatus.REVOKED
        assert permit.revoke_reason == f"human approval required by policy {policy_id}"
    for permit_id in (from_operator, approved, untouched):
        assert _status(permit_id) == PermitStatus.ACTIVE
    created = AuditEvent.objects.filter(event="policy.created").latest("seq")
    assert sorted(created.detail["permits_revoked"]) == sorted([own, for_child, from_sponsor])
    assert AuditEvent.objects.filter(event="permit.revoked", detail__policy_id=policy_id).count() == 3
    # And the agent cannot mint a new one.
    assert _issue(tenant.agent_client, tenant.agent).json()["detail"]["error"] == "human_approval_required"


@pytest.mark.django_db
@pytest.mark.parametrize("change", [{"human_approval_required": True}, {"enabled": True}])
def test_the_change_that_turns_approval_on_revokes_them(tenant: Tenant, change: dict[str, Any]):
    rules: dict[str, Any] = (
        {"human_approval_required": False} if "human_approval_required" in change else {"enabled": False}
    )
    if "enabled" in change:
        rules["human_approval_required"] = True
    policy = services.policy_create(wallet=tenant.sponsor, **rules)
    own = _issue(tenant.agent_client, tenant.agent).json()["permit_id"]
    assert _status(own) == PermitStatus.ACTIVE

    services.policy_update(policy_id=policy.policy_id, name="renamed")  # approval still off: nothing happens
    assert _status(own) == PermitStatus.ACTIVE
    services.policy_update(policy_id=policy.policy_id, **change)
    assert _status(own) == PermitStatus.REVOKED

    # A later change to a policy already requiring approval revokes nothing new (an approved permit stays).
    approved = _approved(tenant.agent, tenant.sponsor).permit_id
    services.policy_update(policy_id=policy.policy_id, name="again", **change)
    assert _status(approved) == PermitStatus.ACTIVE
    assert PolicyBundle.objects.get(policy_id=policy.policy_id).version == 4


@pytest.mark.django_db
def test_a_revoked_permit_cannot_call(tenant: Tenant):
    """Revocation is the permit's status, which authorization and the reservation both read."""
    from permits.services.authorization import authorize

    own = Permit.objects.get(permit_id=_issue(tenant.agent_client, tenant.agent).json()["permit_id"])
    services.policy_create(wallet=tenant.agent, human_approval_required=True)
    own.refresh_from_db()
    decision = authorize(
        permit=own, wallet=tenant.agent, key_id=tenant.agent_key_id, tool="demo.echo", price=Decimal(1)
    )
    assert not decision.allowed
    assert decision.refusal is not None
    assert decision.refusal.code == "permit_revoked"


@pytest.mark.django_db(transaction=True)
def test_an_issuance_racing_the_policy_is_refused_or_revoked():
    """Issuances by the agent's key race the sponsor's policy; whatever the interleaving, once both are
    done no permit the agent issued itself is active."""
    tenant = make_tenant("race")
    agent_secret = tenant.agent_secret
    statuses: list[int] = []
    rounds = 4
    for _ in range(rounds):
        barrier = threading.Barrier(4)

        def issue(barrier: threading.Barrier = barrier) -> None:
            client = client_for(agent_secret)
            barrier.wait()
            try:
                statuses.append(_issue(client, tenant.agent).status_code)
            finally:
                connection.close()

        def turn_on(policy_id: str, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            try:
                services.policy_update(policy_id=policy_id, human_approval_required=True)
            finally:
                connection.close()

        policy = services.policy_create(wallet=tenant.sponsor, human_approval_required=False)
        threads = [threading.Thread(target=issue) for _ in range(3)]
        threads.append(threading.Thread(target=turn_on, args=(policy.policy_id,)))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert not Permit.objects.filter(
            wallet=tenant.agent, status=PermitStatus.ACTIVE, issuer_wallet__isnull=False, issued_via_request_id=""
        ).exists()
        factories.relax_policy(policy.policy_id, enabled=False)
    assert len(statuses) == 3 * rounds
    assert set(statuses) <= {201, 403}, statuses
