"""POST /v1/billing/charge honours the policy bundles of the wallet's line (403 ``policy_denied``).

A bundle binds its wallet and every wallet below it. Of its rules a charge meets the allowed
categories, the amount per charge and the daily cap (the tool rules bind tool calls, human approval
binds permit issuance). A refused charge writes nothing. The daily cap counts the subtree the bundle
binds and is checked again after the debit under its locks, so concurrent charges, grouped in one
commit or not, cannot pass it together. The governed call's authorization reads the same rules:
a last test checks the two agree.
"""

from __future__ import annotations

import threading
from decimal import Decimal
from typing import Any

import pytest
from django.db import connections

from billing import services
from billing.models import ChargeIdempotency, LedgerEntry, Wallet
from permits.models import Permit
from permits.services import authorize, policy_create
from tests import factories
from tests.conftest import Tenant, client_for, make_tenant
from tests.gateway_helpers import issue_permit

D = Decimal


def charge(client: Any, wallet_id: str, units: str = "1", category: str = "compute", key: str | None = None) -> Any:
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    return client.post(f"/v1/billing/charge?wallet_id={wallet_id}&service_category={category}&units={units}", **headers)


def charges(wallet: Wallet) -> int:
    return LedgerEntry.objects.filter(wallet_id=wallet.wallet_id, kind="charge").count()


def refused(answer: Any, rule: str) -> dict[str, Any]:
    assert answer.status_code == 403, answer.content
    detail = answer.json()["detail"]
    assert (detail["error"], detail["rule"]) == ("policy_denied", rule)
    return detail


@pytest.mark.django_db
def test_a_category_outside_the_allowed_ones_is_refused_with_nothing_written(tenant: Tenant) -> None:
    factories.top_up(tenant.agent, 20)
    policy = policy_create(wallet=tenant.sponsor, allowed_categories=["search"])
    before = Wallet.objects.get(pk=tenant.agent.pk).balance
    detail = refused(charge(tenant.agent_client, tenant.agent.wallet_id, key="k-1"), "allowed_categories")
    assert (detail["policy_id"], detail["category"]) == (policy.policy_id, "compute")
    assert Wallet.objects.get(pk=tenant.agent.pk).balance == before
    assert charges(tenant.agent) == 0
    assert not ChargeIdempotency.objects.exists()  # the key is not burnt
    assert charge(tenant.agent_client, tenant.agent.wallet_id, category="search").status_code == 200


@pytest.mark.django_db
def test_an_amount_over_the_per_charge_limit_is_refused(tenant: Tenant) -> None:
    factories.top_up(tenant.agent, 20)
    policy_create(wallet=tenant.agent, max_credits_per_call=D("2"))
    detail = refused(charge(tenant.agent_client, tenant.agent.wallet_id, units="2.5"), "max_credits_per_call")
    assert (detail["limit"], detail["required"]) == ("2.00000000", "2.50000000")
    assert charge(tenant.agent_client, tenant.agent.wallet_id, units="2").status_code == 200
    assert charges(tenant.agent) == 1


@pytest.mark.django_db
def test_the_daily_cap_counts_the_subtree_it_binds(tenant: Tenant) -> None:
    """A cap on the agent counts what its children spend: a child cannot multiply it."""
    factories.top_up(tenant.agent, 20)
    child = factories.make_wallet(tenant.agent, "kid", 10)
    child_client = client_for(factories.make_key(child).secret)
    policy = policy_create(wallet=tenant.agent, max_daily_credits=D("5"))
    assert charge(child_client, child.wallet_id, units="3").status_code == 200
    detail = refused(charge(tenant.agent_client, tenant.agent.wallet_id, units="3"), "max_daily_credits")
    assert (detail["policy_id"], detail["limit"], detail["spent"], detail["required"]) == (
        policy.policy_id,
        "5.00000000",
        "3.00000000",
        "3.00000000",
    )
    # The child is refused too, without the agent's figure (it counts the child's siblings).
    detail = refused(charge(child_client, child.wallet_id, units="3"), "max_daily_credits")
    assert "spent" not in detail
    assert charge(tenant.agent_client, tenant.agent.wallet_id, units="2").status_code == 200
    assert charges(tenant.agent) + charges(child) == 2


@pytest.mark.django_db
def test_a_sponsor_cap_holds_for_each_agent_line(tenant: Tenant) -> None:
    factories.top_up(tenant.agent, 20)
    sibling = factories.make_wallet(tenant.sponsor, "sibling", 20)
    sibling_client = client_for(factories.make_key(sibling).secret)
    policy_create(wallet=tenant.sponsor, max_daily_credits=D("4"))
    assert charge(tenant.agent_client, tenant.agent.wallet_id, units="4").status_code == 200
    assert charge(sibling_client, sibling.wallet_id, units="4").status_code == 200
    refused(charge(tenant.agent_client, tenant.agent.wallet_id, units="1"), "max_daily_credits")


@pytest.mark.django_db
def test_disabled_bundles_and_tool_rules_do_not_bind_a_charge(tenant: Tenant) -> None:
    factories.top_up(tenant.agent, 20)
    policy_create(wallet=tenant.sponsor, allowed_categories=["search"], enabled=False)
    policy_create(wallet=tenant.agent, allowed_tools=[], denied_tools=["*"], human_approval_required=True)
    assert charge(tenant.agent_client, tenant.agent.wallet_id).status_code == 200


@pytest.mark.django_db
def test_a_bundle_below_the_wallet_does_not_bind_it(tenant: Tenant) -> None:
    factories.top_up(tenant.agent, 20)
    child = factories.make_wallet(tenant.agent, "kid", 1)
    policy_create(wallet=child, allowed_categories=["search"])
    assert charge(tenant.agent_client, tenant.agent.wallet_id).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_concurrent_charges_cannot_pass_a_daily_cap_together() -> None:
    """Twelve charges of 1 against a cap of 5, from threads of one process (so grouped commits too) and
    on the wallet and its child: exactly five pass, however they interleave."""
    tenant = make_tenant("capped")
    factories.top_up(tenant.agent, 30)
    child = factories.make_wallet(tenant.agent, "kid", 10)
    policy_create(wallet=tenant.agent, max_daily_credits=D("5"))
    start = threading.Barrier(12)
    codes: list[int] = []

    def one(wallet: Wallet) -> None:
        try:
            start.wait()
            try:
                services.wallet_charge(wallet=wallet.wallet_id, service_category="compute")
                codes.append(200)
            except Exception as exc:  # the refusal, as the endpoint would answer it
                codes.append(getattr(exc, "http_status", 500))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=one, args=(tenant.agent if i % 2 else child,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(codes) == [200] * 5 + [403] * 7
    assert charges(tenant.agent) + charges(child) == 5


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("rules", "category", "amount"),
    [
        ({"allowed_categories": ["compute"]}, "compute", "1"),
        ({"allowed_categories": ["search"]}, "compute", "1"),
        ({"max_credits_per_call": "2"}, "compute", "2"),
        ({"max_credits_per_call": "2"}, "compute", "2.5"),
        ({"max_daily_credits": "3"}, "compute", "3"),
        ({"max_daily_credits": "3"}, "compute", "3.5"),
        ({"max_credits_per_call": "1", "allowed_categories": ["search"]}, "compute", "2"),
    ],
)
def test_a_charge_and_a_governed_call_read_the_same_rules_alike(
    tenant: Tenant, rules: dict[str, Any], category: str, amount: str
) -> None:
    """The same bundle decides a charge (in billing_charge) and a call at the same price in the same
    category (in ``authorize``) the same way, naming the same rule."""
    factories.top_up(tenant.agent, 20)
    typed: dict[str, Any] = {k: (D(v) if isinstance(v, str) else v) for k, v in rules.items()}
    policy_create(wallet=tenant.sponsor, **typed)
    permit = Permit.objects.get(pk=issue_permit(tenant, tools=["*"]))
    decision = authorize(
        permit=permit, wallet=tenant.agent, key_id=tenant.agent_key_id, tool="t", price=D(amount), category=category
    )
    answer = charge(tenant.agent_client, tenant.agent.wallet_id, units=amount, category=category)
    if decision.allowed:
        assert answer.status_code == 200, answer.content
    else:
        assert decision.refusal is not None
        assert refused(answer, decision.refusal.extra["rule"])
