"""POST /v1/billing/charge honours the policy bundles of the wallet's line (403 ``policy_denied``).

A bundle binds its wallet and every wallet below it. Of its rules a charge meets the allowed
categories, the amount per charge and the daily cap (the tool rules bind tool calls, human approval
binds permit issuance). A refused charge writes nothing. The daily cap counts the subtree the bundle
binds and is checked again after the debit under its locks, so concurrent charges, grouped in one
commit or not, cannot pass it together. One database function, ``permits_policy_verdict``, judges the
rules for a charge and for a governed call: the last tests go through both paths.
"""

from __future__ import annotations

import threading
from decimal import Decimal
from typing import Any

import pytest
from django.db import connections

from billing import services
from billing.models import ChargeIdempotency, LedgerEntry, Wallet
from billing.services import tool_price_set
from common.ids import new_id
from mcpgateway.models import Tool
from permits.services import PolicyVerdict, policy_create, policy_update, policy_verdict_read, tool_allowed
from tests import factories
from tests.conftest import Tenant, client_for, make_tenant
from tests.gateway_helpers import Caller, issue_permit, tools_call_body

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


def governed_call(tenant: Tenant, permit_id: str, *, category: str, amount: str) -> dict[str, Any]:
    """A governed call of the upstream's ``echo``, put in ``category`` at ``amount`` credits: its JSON-RPC answer."""
    Tool.objects.filter(service_id="echo").update(category=category)
    tool_price_set(tool="echo", credits=D(amount))
    return Caller(tenant, permit_id).rpc("echo", {}).json()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("rules", "amount", "call_rule", "charge_rule"),
    [
        ({"allowed_categories": ["compute"]}, "1", None, None),
        ({"allowed_categories": ["search"]}, "1", "allowed_categories", "allowed_categories"),
        ({"max_credits_per_call": "2"}, "2", None, None),
        ({"max_credits_per_call": "2"}, "2.5", "max_credits_per_call", "max_credits_per_call"),
        ({"max_daily_credits": "3"}, "3", None, None),
        ({"max_daily_credits": "3"}, "3.5", "max_daily_credits", "max_daily_credits"),
        (
            {"max_credits_per_call": "1", "allowed_categories": ["search"]},
            "2",
            "max_credits_per_call",
            "max_credits_per_call",
        ),
        # The tool rules bind the call only (a charge has no tool); the charge meets the next rule.
        ({"allowed_tools": ["other.*"], "max_credits_per_call": "1"}, "2", "allowed_tools", "max_credits_per_call"),
        ({"denied_tools": ["*"]}, "1", "denied_tools", None),
        ({"allowed_tools": ["ech"], "denied_tools": ["echo.*"]}, "1", "allowed_tools", None),
        ({"allowed_tools": ["ech", "echo"], "denied_tools": ["ec*"]}, "1", None, None),
        # A tool of no server is in no server list; a charge has no server.
        ({"allowed_servers": ["alpha"]}, "1", "allowed_servers", None),
    ],
)
def test_a_charge_and_a_governed_call_are_judged_by_the_one_function(
    fault: Any, tenant: Tenant, rules: dict[str, Any], amount: str, call_rule: str | None, charge_rule: str | None
) -> None:
    """``permits_policy_verdict`` judges a bundle for a charge (in billing_charge) and for a governed call
    (in the lookup's round trip): at the same price in the same category both are allowed or refused
    naming the same rule, except the tool rules, which bind only the call."""
    factories.top_up(tenant.agent, 20)
    typed: dict[str, Any] = {k: (D(v) if isinstance(v, str) else v) for k, v in rules.items()}
    policy = policy_create(wallet=tenant.sponsor, **typed)
    body = governed_call(tenant, issue_permit(tenant, tools=["*"]), category="compute", amount=amount)
    # The charge on a sibling line, which the sponsor's bundle binds the same way (its own daily cap).
    sibling = factories.make_wallet(tenant.sponsor, "sibling", 20)
    answer = charge(client_for(factories.make_key(sibling).secret), sibling.wallet_id, units=amount)
    if call_rule is None:
        assert body["result"]["_meta"]["io.tollgate/outcome"] == "success", body
    else:
        data = body["error"]["data"]
        assert (data["error"], data["policy_id"], data["rule"]) == ("policy_denied", policy.policy_id, call_rule)
        assert data["outcome"] == "denied"
        assert data["policy_decision_id"].startswith("pdec_")
    if charge_rule is None:
        assert answer.status_code == 200, answer.content
    else:
        assert refused(answer, charge_rule)["policy_id"] == policy.policy_id
    assert fault.count("tools/call") == (1 if call_rule is None else 0)  # a refused call sent nothing


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("patterns", "tool", "matches"),
    [
        (["*"], "echo", True),
        (["echo"], "echo", True),
        (["ech"], "echo", False),
        (["echo.*"], "echo", False),
        (["echo.*"], "echo.sub", True),
        (["ec*"], "echo", False),  # only '*' alone and 'prefix.*' are wildcards
        (["ech.*"], "echo.x", False),
        ([], "echo", False),
    ],
)
def test_the_tool_patterns_of_a_bundle(tenant: Tenant, patterns: list[str], tool: str, matches: bool) -> None:
    """The verdict's tool patterns, as the permit's own allowed_tools read them (``tool_allowed``): a denied
    pattern refuses exactly the tools an allowed one admits."""
    denying = policy_create(wallet=tenant.sponsor, denied_tools=patterns)
    allowing = policy_create(wallet=tenant.agent, allowed_tools=patterns)
    verdict = policy_verdict_read(wallet=tenant.agent, tool=tool, category="compute", amount=D(1))
    assert verdict.refused_by == (
        (denying.policy_id, "denied_tools", None) if matches else (allowing.policy_id, "allowed_tools", None)
    )
    assert tool_allowed(patterns, tool) is matches


@pytest.mark.django_db
def test_the_verdict_reads_only_the_tenants_bundles(tenant: Tenant, other_tenant: Tenant) -> None:
    """Another tenant's id reads none of this tenant's bundles (the function is ready for a sharded database)."""
    policy = policy_create(wallet=tenant.agent, denied_tools=["*"], max_daily_credits=D(1))
    mine = policy_verdict_read(wallet=tenant.agent, tool="echo", category="compute", amount=D(1))
    assert mine.refused_by == (policy.policy_id, "denied_tools", None)
    foreign = Wallet(wallet_id=tenant.agent.wallet_id, tenant_id=other_tenant.sponsor.tenant_id, path=tenant.agent.path)
    assert policy_verdict_read(wallet=foreign, tool="echo", category="compute", amount=D(1)) == PolicyVerdict()


def call_as(wallet: Wallet, tenant: Tenant, *, price: str) -> dict[str, Any]:
    """A governed call of ``echo`` at ``price`` by a key of ``wallet`` under a permit the sponsor issued it."""
    r = tenant.sponsor_client.post(
        "/v1/permits",
        {"wallet_id": wallet.wallet_id, "allowed_tools": ["*"], "max_credits": "100"},
        format="json",
        HTTP_IDEMPOTENCY_KEY=new_id("pk"),
    )
    assert r.status_code == 201, r.content
    tool_price_set(tool="echo", credits=D(price))
    client = client_for(factories.make_key(wallet).secret)
    answer: dict[str, Any] = client.post(
        "/mcp/messages", tools_call_body("echo", permit_id=r.json()["permit_id"]), format="json"
    ).json()
    return answer


def cap_refusal(answer: dict[str, Any], policy_id: str) -> dict[str, Any]:
    assert "error" in answer, answer
    data: dict[str, Any] = answer["error"]["data"]
    assert "rule" in data, data
    assert (data["error"], data["rule"], data["policy_id"], data["outcome"]) == (
        "policy_denied",
        "max_daily_credits",
        policy_id,
        "denied",
    )
    assert data["policy_decision_id"].startswith("pdec_")
    return data


def succeeded(answer: dict[str, Any]) -> bool:
    return bool(answer.get("result", {}).get("_meta", {}).get("io.tollgate/outcome") == "success")


@pytest.mark.django_db
def test_a_governed_calls_daily_cap_counts_the_subtree_it_binds(fault: Any, tenant: Tenant) -> None:
    """The verdict's cap wallets, checked by the claim after its debit: an agent under a capped bundle cannot
    multiply the cap through children it creates; a cap on the sponsor holds for each agent line."""
    spender = factories.make_wallet(tenant.agent, "kid", 20)
    fresh = factories.make_wallet(tenant.agent, "kid2", 20)  # has spent nothing itself
    sibling = factories.make_wallet(tenant.sponsor, "sibling", 20)
    factories.top_up(tenant.agent, 20)
    on_agent = policy_create(wallet=tenant.agent, max_daily_credits=D("10"))
    assert succeeded(call_as(spender, tenant, price="8"))
    refused_call = cap_refusal(call_as(fresh, tenant, price="3"), on_agent.policy_id)
    assert "spent" not in refused_call  # the agent's line counts the child's siblings: not the child's to read
    assert succeeded(call_as(fresh, tenant, price="2"))
    own = cap_refusal(call_as(tenant.agent, tenant, price="1"), on_agent.policy_id)
    assert (own["spent"], own["limit"], own["required"]) == ("10.00000000", "10.00000000", "1.00000000")

    policy_update(policy_id=on_agent.policy_id, enabled=False)
    on_sponsor = policy_create(wallet=tenant.sponsor, max_daily_credits=D("10"))
    cap_refusal(call_as(fresh, tenant, price="1"), on_sponsor.policy_id)  # the agent's line has spent 10
    assert succeeded(call_as(sibling, tenant, price="3"))  # another line under the same sponsor: its own 10
    assert fault.count("tools/call") == 3


@pytest.mark.django_db
def test_the_verdict_refuses_a_permit_a_key_issued_unapproved_before_any_other_rule(tenant: Tenant) -> None:
    """Under a bundle requiring human approval, a permit whose signed statement names a wallet as issuer and
    no approval is refused first (rule human_approval_required), whatever older bundle refuses too; an
    operator's or an approved permit meets the other rules; a charge has no permit."""
    from permits.models import Permit

    older = policy_create(wallet=tenant.sponsor, denied_tools=["*"])
    approval = policy_create(wallet=tenant.agent, human_approval_required=True)

    def verdict(statement: dict[str, Any] | None) -> Any:
        permit = Permit(signed_statement=statement) if statement is not None else None
        return policy_verdict_read(wallet=tenant.agent, tool="echo", category="compute", amount=D(1), permit=permit)

    by_key = {"issuer_wallet_id": tenant.agent.wallet_id, "approval": None}
    assert verdict(by_key).refused_by == (approval.policy_id, "human_approval_required", None)
    no_key = {"issuer_wallet_id": tenant.agent.wallet_id}  # the approval key absent: unapproved too
    assert verdict(no_key).refused_by == (approval.policy_id, "human_approval_required", None)
    approved = {**by_key, "approval": {"approval_id": "apv_1"}}
    assert verdict(approved).refused_by == (older.policy_id, "denied_tools", None)
    assert verdict({"issuer_wallet_id": None}).refused_by == (older.policy_id, "denied_tools", None)
    assert verdict(None).refused_by == (older.policy_id, "denied_tools", None)
