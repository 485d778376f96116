"""The agent the gateway governs tries to widen its own authority (adversarial review).

Each test reproduces an attack that worked before the rule it exercises existed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from audit.models import AuditEvent
from billing.models import LedgerEntry
from common.ids import new_id
from permits.models import PolicyBundle
from permits.services import policy_create
from tests.conftest import Tenant, client_for
from tests.gateway_helpers import Caller, register_upstream
from tests.upstream_server import running_demo_upstream

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def demo_url() -> Iterator[str]:
    with running_demo_upstream() as demo:
        yield demo.url


@pytest.fixture
def demo(settings: Any, demo_url: str) -> str:
    settings.UPSTREAM_MCP_URL = demo_url
    register_upstream(demo_url, price="1")
    return demo_url


def _self_permit(tenant: Tenant, tools: list[str]) -> Any:
    return tenant.agent_client.post(
        "/v1/permits",
        {"wallet_id": tenant.agent.wallet_id, "allowed_tools": tools, "max_credits": "50"},
        format="json",
        HTTP_IDEMPOTENCY_KEY=new_id("pk"),
    )


# --- 1. Policies an agent did not set are out of its reach ---------------------------


def test_agent_cannot_disable_a_policy_its_sponsor_set(tenant: Tenant, demo: str) -> None:
    created = tenant.sponsor_client.post(
        "/v1/policies", {"wallet_id": tenant.agent.wallet_id, "allowed_tools": ["clock.now"]}, format="json"
    )
    assert created.status_code == 201, created.content
    policy_id = created.json()["policy_id"]
    assert created.json()["created_by_wallet_id"] == tenant.sponsor.wallet_id

    r = tenant.agent_client.patch(f"/v1/policies/{policy_id}", {"enabled": False}, format="json")
    assert r.status_code == 403, r.content
    assert r.json()["detail"]["error"] == "policy_read_only"
    policy = PolicyBundle.objects.get(policy_id=policy_id)
    assert policy.enabled is True
    assert policy.version == 1
    # The agent still sees it: it binds the agent.
    assert tenant.agent_client.get(f"/v1/policies/{policy_id}").status_code == 200

    # A permit the agent mints itself for every tool stays bound by the policy at every call.
    from tests import factories

    factories.top_up(tenant.agent, 10)
    minted = _self_permit(tenant, ["*"])
    assert minted.status_code == 201, minted.content
    caller = Caller(tenant, minted.json()["permit_id"])
    denied = caller.invoke("math.add", {"a": 1, "b": 2})
    assert denied.status_code == 403, denied.content
    assert denied.json()["outcome"] == "denied"
    assert denied.json()["reason_code"] == "policy_denied"
    assert caller.invoke("clock.now").status_code == 200


def test_agent_cannot_lift_human_approval_set_above_it(tenant: Tenant) -> None:
    created = tenant.sponsor_client.post(
        "/v1/policies", {"wallet_id": tenant.agent.wallet_id, "human_approval_required": True}, format="json"
    )
    policy_id = created.json()["policy_id"]
    r = tenant.agent_client.patch(f"/v1/policies/{policy_id}", {"human_approval_required": False}, format="json")
    assert r.status_code == 403
    minted = _self_permit(tenant, ["*"])
    assert minted.status_code == 403, minted.content
    assert minted.json()["detail"]["error"] == "human_approval_required"


def test_operator_policy_is_read_only_to_every_wallet_key(tenant: Tenant, operator_client: Any) -> None:
    created = operator_client.post(
        "/v1/policies", {"wallet_id": tenant.sponsor.wallet_id, "denied_tools": ["math.add"]}, format="json"
    )
    assert created.status_code == 201, created.content
    policy_id = created.json()["policy_id"]
    assert created.json()["created_by_wallet_id"] == ""
    # The sponsor sees the policy on its wallet but cannot change it; to the agent below,
    # a policy on its parent is out of reach altogether (404, docs/architecture.md, "Tenancy and authority").
    for client, expected in ((tenant.sponsor_client, 403), (tenant.agent_client, 404)):
        r = client.patch(f"/v1/policies/{policy_id}", {"denied_tools": []}, format="json")
        assert r.status_code == expected, r.content
    assert operator_client.patch(f"/v1/policies/{policy_id}", {"name": "x"}, format="json").status_code == 200


def test_console_policy_is_read_only_to_wallet_keys(tenant: Tenant) -> None:
    policy = policy_create(wallet=tenant.agent, denied_tools=["math.add"])
    r = tenant.agent_client.patch(f"/v1/policies/{policy.policy_id}", {"enabled": False}, format="json")
    assert r.status_code == 403


def test_agent_manages_policies_it_set_itself_and_below(tenant: Tenant) -> None:
    child_r = tenant.agent_client.post(
        "/v1/billing/wallets/agent", {"parent_wallet_id": tenant.agent.wallet_id, "name": "kid"}, format="json"
    )
    assert child_r.status_code == 201, child_r.content
    child_id = child_r.json()["wallet_id"]
    for wallet_id in (tenant.agent.wallet_id, child_id):
        created = tenant.agent_client.post(
            "/v1/policies", {"wallet_id": wallet_id, "denied_tools": ["math.add"]}, format="json"
        )
        assert created.status_code == 201, created.content
        policy_id = created.json()["policy_id"]
        r = tenant.agent_client.patch(f"/v1/policies/{policy_id}", {"enabled": False}, format="json")
        assert r.status_code == 200, r.content
        # The sponsor, above the level the policy was set at, may change it too.
        r = tenant.sponsor_client.patch(f"/v1/policies/{policy_id}", {"enabled": True}, format="json")
        assert r.status_code == 200, r.content


def _approval_rule_and_level(policy_id: str) -> tuple[bool, bool, str]:
    policy = PolicyBundle.objects.get(policy_id=policy_id)
    return policy.human_approval_required, policy.enabled, policy.authority_wallet_id


def test_a_rule_changed_from_above_cannot_be_undone_below(tenant: Tenant, operator_client: Any) -> None:
    """A policy an agent set on itself is its own to change until its sponsor changes it: the sponsor's
    rule then binds the agent (403), and the operator's binds both."""
    created = tenant.agent_client.post(
        "/v1/policies", {"wallet_id": tenant.agent.wallet_id, "denied_tools": ["math.add"]}, format="json"
    )
    policy_id = created.json()["policy_id"]
    assert tenant.agent_client.patch(f"/v1/policies/{policy_id}", {"name": "mine"}, format="json").status_code == 200
    tightened = tenant.sponsor_client.patch(
        f"/v1/policies/{policy_id}", {"human_approval_required": True}, format="json"
    )
    assert tightened.status_code == 200, tightened.content
    assert tightened.json()["created_by_wallet_id"] == tenant.agent.wallet_id  # the creator stays on record

    for change in ({"human_approval_required": False}, {"enabled": False}, {"name": "mine again"}):
        r = tenant.agent_client.patch(f"/v1/policies/{policy_id}", change, format="json")
        assert r.status_code == 403, r.content
        assert r.json()["detail"]["error"] == "policy_read_only"
    assert _approval_rule_and_level(policy_id) == (True, True, tenant.sponsor.wallet_id)
    assert _self_permit(tenant, ["*"]).json()["detail"]["error"] == "human_approval_required"
    event = AuditEvent.objects.filter(event="policy.updated").latest("seq")
    assert (event.detail["authority_before"], event.detail["authority_after"]) == (
        tenant.agent.wallet_id,
        tenant.sponsor.wallet_id,
    )

    assert operator_client.patch(f"/v1/policies/{policy_id}", {"name": "ops"}, format="json").status_code == 200
    r = tenant.sponsor_client.patch(f"/v1/policies/{policy_id}", {"human_approval_required": False}, format="json")
    assert r.status_code == 403, r.content


def test_a_change_from_above_landing_during_the_agents_change_stands(tenant: Tenant, monkeypatch: Any) -> None:
    """The agent's PATCH passed the level check on an unlocked read; the sponsor's change commits before
    the agent's update takes the row's lock. The update reads the level again under the lock: 403, and
    the sponsor's rule and level stand."""
    from permits import selectors, services, views

    created = tenant.agent_client.post(
        "/v1/policies", {"wallet_id": tenant.agent.wallet_id, "denied_tools": ["math.add"]}, format="json"
    )
    policy_id = created.json()["policy_id"]
    checked = selectors.policy_for_change

    def sponsor_lands_after_the_check(principal: Any, pid: str) -> PolicyBundle:
        policy = checked(principal, pid)
        services.policy_update(policy_id=pid, actor_wallet_id=tenant.sponsor.wallet_id, human_approval_required=True)
        return policy

    monkeypatch.setattr(views.selectors, "policy_for_change", sponsor_lands_after_the_check)
    r = tenant.agent_client.patch(
        f"/v1/policies/{policy_id}", {"human_approval_required": False, "enabled": False}, format="json"
    )
    assert r.status_code == 403, r.content
    assert r.json()["detail"]["error"] == "policy_read_only"
    assert _approval_rule_and_level(policy_id) == (True, True, tenant.sponsor.wallet_id)


def test_child_key_cannot_change_its_parents_policy_on_the_child(tenant: Tenant) -> None:
    from tests import factories

    child = factories.make_wallet(tenant.agent, "kid")
    child_client = client_for(factories.make_key(child).secret)
    created = tenant.agent_client.post(
        "/v1/policies", {"wallet_id": child.wallet_id, "denied_tools": ["math.add"]}, format="json"
    )
    assert created.status_code == 201
    r = child_client.patch(f"/v1/policies/{created.json()['policy_id']}", {"enabled": False}, format="json")
    assert r.status_code == 403


def test_sibling_cannot_see_or_change_a_policy(tenant: Tenant) -> None:
    from tests import factories

    sibling = factories.make_wallet(tenant.sponsor, "sibling")
    sibling_client = client_for(factories.make_key(sibling).secret)
    created = tenant.agent_client.post(
        "/v1/policies", {"wallet_id": tenant.agent.wallet_id, "denied_tools": ["math.add"]}, format="json"
    )
    policy_id = created.json()["policy_id"]
    assert sibling_client.get(f"/v1/policies/{policy_id}").status_code == 404
    assert sibling_client.patch(f"/v1/policies/{policy_id}", {"enabled": False}, format="json").status_code == 404


def test_policy_authority_column_rule_reads_the_level_it_names(tenant: Tenant) -> None:
    """A policy whose level reads the sponsor's is read-only to the agent, whoever created it."""
    created = tenant.agent_client.post(
        "/v1/policies", {"wallet_id": tenant.agent.wallet_id, "denied_tools": ["math.add"]}, format="json"
    )
    policy_id = created.json()["policy_id"]
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE permits_policy_bundle SET authority_wallet_id = %s WHERE policy_id = %s",
            [tenant.sponsor.wallet_id, policy_id],
        )
    r = tenant.agent_client.patch(f"/v1/policies/{policy_id}", {"enabled": False}, format="json")
    assert r.status_code == 403
    assert not LedgerEntry.objects.filter(kind="charge").exists()


# --- 2. Spend controls cover the subtree --------------------------------------------------


def _charge(client: Any, wallet_id: str, units: str, category: str = "compute") -> Any:
    return client.post(f"/v1/billing/charge?wallet_id={wallet_id}&service_category={category}&units={units}")


def _child(client: Any, parent_id: str, initial_balance: str = "0", **extra: Any) -> Any:
    return client.post(
        "/v1/billing/wallets/agent",
        {"parent_wallet_id": parent_id, "name": f"kid-{new_id('n')}", "initial_balance": initial_balance, **extra},
        format="json",
    )


def _limited_agent(tenant: Tenant, **controls: Any) -> tuple[str, Any]:
    """An agent wallet with spend controls, its own key and 100 credits, created by the sponsor."""
    from tests import factories

    factories.top_up(tenant.sponsor, 100)
    r = tenant.sponsor_client.post(
        "/v1/billing/wallets/agent",
        {"parent_wallet_id": tenant.sponsor.wallet_id, "name": "limited", "initial_balance": "100", **controls},
        format="json",
    )
    assert r.status_code == 201, r.content
    wallet_id = r.json()["wallet_id"]
    from billing.models import Wallet

    return wallet_id, client_for(factories.make_key(Wallet.objects.get(pk=wallet_id)).secret)


def test_budget_and_daily_limit_bound_the_children(tenant: Tenant) -> None:
    agent_id, agent = _limited_agent(tenant, budget="5", daily_limit="5")
    assert _charge(agent, agent_id, "10").status_code == 403
    kid = _child(agent, agent_id, "45")
    assert kid.status_code == 201, kid.content
    kid_id = kid.json()["wallet_id"]
    r = _charge(agent, kid_id, "40")
    assert r.status_code == 403, r.content
    assert r.json()["detail"]["error"] in ("budget_exceeded", "daily_limit_exceeded")
    assert r.json()["detail"]["wallet_id"] == agent_id
    # Small charges spread over the agent and its child stop at the agent's limit, together.
    assert _charge(agent, kid_id, "3").status_code == 200
    assert _charge(agent, agent_id, "2").status_code == 200
    assert _charge(agent, kid_id, "1").status_code == 403
    assert _charge(agent, agent_id, "1").status_code == 403
    detail = agent.get(f"/v1/billing/wallets/{agent_id}").json()
    assert detail["daily_spent"] == "5.00000000"
    assert detail["total_spent"] == "5.00000000"
    assert LedgerEntry.objects.filter(kind="charge", wallet__path__contains=agent_id).count() == 2


def test_a_refusal_by_an_ancestor_does_not_show_a_child_its_ancestors_figures(tenant: Tenant) -> None:
    """A child's charge refused by its agent's budget names the agent, but the agent's budget and spend
    (which count the child's siblings) are for the agent's key and above, not the child's."""
    from billing.models import Wallet
    from tests import factories

    agent_id, agent = _limited_agent(tenant, budget="10")
    kids = [_child(agent, agent_id, "20").json()["wallet_id"] for _ in range(2)]
    sibling, child_id = kids
    assert _charge(agent, sibling, "7").status_code == 200  # the sibling's spend counts in the agent's budget
    child = client_for(factories.make_key(Wallet.objects.get(pk=child_id)).secret)
    r = _charge(child, child_id, "5")
    assert r.status_code == 403, r.content
    detail = r.json()["detail"]
    assert (detail["error"], detail["wallet_id"], detail["required"]) == ("budget_exceeded", agent_id, "5.00000000")
    assert not {"budget", "total_spent"} & set(detail), detail
    seen_by_agent = _charge(agent, child_id, "5").json()["detail"]
    assert (seen_by_agent["budget"], seen_by_agent["total_spent"]) == ("10.00000000", "7.00000000")


def test_velocity_counts_the_subtree_and_freezes_the_agent(tenant: Tenant) -> None:
    from billing.models import Wallet
    from tests import factories

    factories.top_up(tenant.agent, 3000)
    accepted = 0
    for _ in range(6):
        kid = _child(tenant.agent_client, tenant.agent.wallet_id, "500")
        if kid.status_code != 201:
            assert kid.status_code == 403, kid.content
            break
        r = _charge(tenant.agent_client, kid.json()["wallet_id"], "400")
        if r.status_code == 200:
            accepted += 400
        else:
            assert r.status_code == 403, r.content
            assert r.json()["detail"]["error"] == "wallet_frozen"
            assert r.json()["detail"]["wallet_id"] == tenant.agent.wallet_id
    assert accepted <= 1000
    assert Wallet.objects.get(pk=tenant.agent.wallet_id).status == "frozen"
    # The freeze covers the subtree: no child charges, funds or creates anything now.
    kid_ids = list(Wallet.objects.filter(parent_id=tenant.agent.wallet_id).values_list("wallet_id", flat=True))
    for kid_id in kid_ids:
        assert _charge(tenant.agent_client, kid_id, "0.1", "tooling").status_code == 403
    assert _child(tenant.agent_client, tenant.agent.wallet_id).status_code == 403


def test_frozen_agent_cannot_charge_or_fund_its_child(tenant: Tenant, operator_client: Any) -> None:
    from billing.models import Wallet
    from billing.services import wallet_freeze
    from tests import factories

    factories.top_up(tenant.agent, 100)
    kid_id = _child(tenant.agent_client, tenant.agent.wallet_id, "50").json()["wallet_id"]
    kid_client = client_for(factories.make_key(Wallet.objects.get(pk=kid_id)).secret)
    wallet_freeze(wallet=tenant.agent, reason="review")
    for client in (tenant.agent_client, kid_client):
        r = _charge(client, kid_id, "1")
        assert r.status_code == 403, r.content
        assert r.json()["detail"]["error"] == "wallet_frozen"
        assert r.json()["detail"]["wallet_id"] == tenant.agent.wallet_id
    r = tenant.agent_client.post(
        "/v1/billing/wallets/agent", {"parent_wallet_id": tenant.agent.wallet_id, "name": "x"}, format="json"
    )
    assert r.status_code == 403
    assert Wallet.objects.get(pk=kid_id).balance == 50


def test_sponsor_funding_its_agents_freezes_nothing(tenant: Tenant) -> None:
    from billing.models import Wallet
    from tests import factories

    factories.top_up(tenant.sponsor, 30_000)
    for _ in range(3):
        r = _child(tenant.sponsor_client, tenant.sponsor.wallet_id, "9000")
        assert r.status_code == 201, r.content
    assert Wallet.objects.get(pk=tenant.sponsor.wallet_id).status == "active"
    # Agents funding their children move credits within the subtree: not spend either.
    agent_id = r.json()["wallet_id"]
    agent_client = client_for(factories.make_key(Wallet.objects.get(pk=agent_id)).secret)
    for _ in range(3):
        assert _child(agent_client, agent_id, "2000").status_code == 201
    assert Wallet.objects.get(pk=agent_id).status == "active"


def test_refunds_give_back_the_ancestor_window(tenant: Tenant) -> None:
    from billing.models import Wallet
    from billing.services import wallet_refund
    from tests import factories

    agent_id, agent = _limited_agent(tenant, daily_limit="10")
    kid_id = _child(agent, agent_id, "50").json()["wallet_id"]
    assert _charge(agent, kid_id, "10").status_code == 200
    assert _charge(agent, kid_id, "1").status_code == 403
    wallet_refund(amount=4, charge=LedgerEntry.objects.get(wallet_id=kid_id, kind="charge"))
    assert _charge(agent, kid_id, "4").status_code == 200
    assert _charge(agent, kid_id, "1").status_code == 403
    assert Wallet.objects.get(pk=agent_id).total_spent == 10
    del factories


# --- 6. Charges refuse what they cannot honour ----------------------------------------------


def test_unpayable_charge_is_402_and_freezes_nothing(tenant: Tenant) -> None:
    from billing.models import Wallet
    from tests import factories

    factories.top_up(tenant.agent, 10)
    r = _charge(tenant.agent_client, tenant.agent.wallet_id, "5000")
    assert r.status_code == 402, r.content
    assert r.json()["detail"]["error"] == "insufficient_funds"
    assert Wallet.objects.get(pk=tenant.agent.wallet_id).status == "active"
    assert _charge(tenant.agent_client, tenant.agent.wallet_id, "1").status_code == 200


def test_charge_that_rounds_to_zero_is_422(tenant: Tenant) -> None:
    from tests import factories

    factories.top_up(tenant.agent, 10)
    r = _charge(tenant.agent_client, tenant.agent.wallet_id, "0.00000001", "tooling")
    assert r.status_code == 422, r.content
    assert r.json()["detail"][0]["type"] == "amount_too_small"
    assert not LedgerEntry.objects.filter(kind="charge").exists()


# --- 3. Siblings and parents stay invisible -------------------------------------------------


def test_audit_listings_and_summary_cover_only_the_subtree(tenant: Tenant) -> None:
    from audit.models import AuditEvent
    from tests import factories

    sibling = factories.make_wallet(tenant.sponsor, "sibling", balance=20)
    factories.make_key(sibling)
    factories.top_up(tenant.agent, 5)
    child = factories.make_wallet(tenant.agent, "kid", balance=1)
    sibling_events = AuditEvent.objects.filter(wallet_id=sibling.wallet_id).count()
    assert sibling_events > 0
    agent = tenant.agent_client
    filters: list[dict[str, str]] = [{"wallet_id": sibling.wallet_id}, {"wallet_id": tenant.sponsor.wallet_id}, {}]
    for params in filters:
        body = agent.get("/v1/audit/events", {**params, "limit": "200"}).json()
        seen = {item["wallet_id"] for item in body["items"]}
        assert seen <= {tenant.agent.wallet_id, child.wallet_id}, (params, seen)
        assert sibling.wallet_id not in str(body.get("items"))
    own = agent.get("/v1/audit/events", {"limit": "200"}).json()
    assert child.wallet_id in {item["wallet_id"] for item in own["items"]}
    reachable = AuditEvent.objects.filter(wallet_id__in=[tenant.agent.wallet_id, child.wallet_id]).count()
    assert own["total"] == reachable
    summary = agent.get("/v1/audit/summary").json()
    assert summary["total"] == reachable
    assert tenant.sponsor_client.get("/v1/audit/summary").json()["total"] > reachable + sibling_events - 1
    r = agent.post("/v1/audit/verify-chain", {}, format="json")
    assert r.status_code == 403
    assert r.json()["detail"]["error"] == "wallet_access_denied"


# --- 4. Keys cannot outlive the key that minted them ----------------------------------------


def _mint(client: Any, wallet_id: str) -> dict[str, Any]:
    r = client.post("/v1/api-keys", {"wallet_id": wallet_id, "name": "spare"}, format="json")
    assert r.status_code == 201, r.content
    return dict(r.json())


def _alive(secret: str, wallet_id: str) -> bool:
    return client_for(secret).get(f"/v1/billing/wallets/{wallet_id}").status_code == 200


def test_revoking_a_key_revokes_what_it_minted(tenant: Tenant, operator_client: Any) -> None:
    agent_id = tenant.agent.wallet_id
    spare = _mint(tenant.agent_client, agent_id)
    assert spare["created_by_key_id"] == tenant.agent_key_id
    grandchild = _mint(client_for(spare["secret"]), agent_id)
    assert _alive(grandchild["secret"], agent_id)
    r = operator_client.delete(f"/v1/api-keys/{agent_id}/{tenant.agent_key_id}")
    assert r.status_code == 204
    assert not _alive(spare["secret"], agent_id)
    assert not _alive(grandchild["secret"], agent_id)
    logs = tenant.sponsor_client.get(f"/v1/api-keys/{agent_id}/logs").json()
    lineage = [entry for entry in logs if entry["reason"].startswith("lineage:")]
    assert {entry["key_id"] for entry in lineage} == {spare["key_id"], grandchild["key_id"]}
    created = {entry["key_id"]: entry["actor_key_id"] for entry in logs if entry["action"] == "created"}
    assert created[spare["key_id"]] == tenant.agent_key_id
    assert created[grandchild["key_id"]] == spare["key_id"]
    # Keys the sponsor minted for the agent are of the sponsor's lineage, not the agent's: they live on.
    sponsor_minted = _mint(tenant.sponsor_client, agent_id)
    assert _alive(sponsor_minted["secret"], agent_id)


def test_rotating_with_revoke_revokes_the_lineage_but_keeps_the_successor(tenant: Tenant) -> None:
    agent_id = tenant.agent.wallet_id
    spare = _mint(tenant.agent_client, agent_id)
    r = tenant.agent_client.post(
        "/v1/api-keys/rotate", {"wallet_id": agent_id, "key_id": tenant.agent_key_id}, format="json"
    )
    assert r.status_code == 200, r.content
    successor = r.json()["new_key"]["secret"]
    assert _alive(successor, agent_id)
    assert not _alive(spare["secret"], agent_id)


def test_a_rotated_copy_does_not_escape_the_lineage(tenant: Tenant, operator_client: Any) -> None:
    agent_id = tenant.agent.wallet_id
    spare = _mint(tenant.agent_client, agent_id)
    # The spare is rotated by the sponsor (another lineage as minter): it still replaced a key of the agent's lineage.
    r = tenant.sponsor_client.post(
        "/v1/api-keys/rotate", {"wallet_id": agent_id, "key_id": spare["key_id"], "revoke_old": False}, format="json"
    )
    assert r.status_code == 200, r.content
    copy = r.json()["new_key"]["secret"]
    assert operator_client.delete(f"/v1/api-keys/{agent_id}/{tenant.agent_key_id}").status_code == 204
    assert not _alive(copy, agent_id)


def test_emergency_revocation_covers_the_subtree(tenant: Tenant) -> None:
    from billing.models import Wallet
    from tests import factories

    child = factories.make_wallet(tenant.agent, "kid")
    child_key = factories.make_key(Wallet.objects.get(pk=child.wallet_id))
    minted_below = _mint(client_for(child_key.secret), child.wallet_id)
    r = tenant.sponsor_client.post(
        "/v1/api-keys/emergency-revoke", {"wallet_id": tenant.agent.wallet_id}, format="json"
    )
    assert r.status_code == 200, r.content
    assert not _alive(tenant.agent_secret, tenant.agent.wallet_id)
    assert not _alive(child_key.secret, child.wallet_id)
    assert not _alive(minted_below["secret"], child.wallet_id)
    assert _alive(tenant.sponsor_secret, tenant.sponsor.wallet_id)


def test_a_revoked_minter_cannot_mint(tenant: Tenant) -> None:
    from django.utils import timezone

    from billing.models import APIKey
    from billing.services import api_key_create
    from common.errors import InvalidAPIKey

    APIKey.objects.filter(key_id=tenant.agent_key_id).update(status="revoked", revoked_at=timezone.now())
    with pytest.raises(InvalidAPIKey):
        api_key_create(wallet=tenant.agent, actor_key_id=tenant.agent_key_id)


# --- 5. Authorization reads the signed statement, not editable columns -----------------------


def test_a_permit_column_edited_after_signing_is_refused_and_reported(tenant: Tenant, demo: str) -> None:
    from billing.models import Wallet
    from permits.models import Permit
    from tests import factories

    factories.top_up(tenant.agent, 10)
    from tests.gateway_helpers import issue_permit

    permit_id = issue_permit(tenant, tools=["clock.now"])
    caller = Caller(tenant, permit_id)
    ok = caller.invoke("clock.now")
    assert ok.status_code == 200, ok.content
    receipt_id = ok.json()["receipt_id"]
    balance = Wallet.objects.get(pk=tenant.agent.wallet_id).balance
    # Someone with write access to the permits table widens the permit; the signed statement still says clock.now.
    with connection.cursor() as cur:
        cur.execute("UPDATE permits_permit SET allowed_tools = '[\"*\"]'::jsonb WHERE permit_id = %s", [permit_id])
    assert Permit.objects.get(pk=permit_id).allowed_tools == ["*"]
    r = caller.invoke("math.add", {"a": 1, "b": 2})
    assert r.status_code == 403, r.content
    assert r.json()["outcome"] == "denied"
    assert r.json()["reason_code"] == "permit_signature_invalid"
    assert Wallet.objects.get(pk=tenant.agent.wallet_id).balance == balance
    evidence = tenant.agent_client.get(f"/v1/evidence/{receipt_id}").json()
    assert evidence["verification"]["permit_signature"] == "statement_mismatch:allowed_tools"
    # Every column authorization reads is covered, not only the tools.
    edits = {
        "max_credits": "max_credits = 1000",
        "max_calls": "max_calls = 1000",
        "expires_at": "expires_at = now() + interval '9 days'",
        "subject_key_id": f"subject_key_id = '{tenant.sponsor_key_id}'",
    }
    restore = (
        "allowed_tools = '[\"clock.now\"]'::jsonb, max_credits = %s, max_calls = %s, expires_at = %s, "
        "subject_key_id = %s"
    )
    original = Permit.objects.get(pk=permit_id)
    for column, assignment in edits.items():
        with connection.cursor() as cur:
            cur.execute(
                f"UPDATE permits_permit SET {restore} WHERE permit_id = %s",
                [original.max_credits, original.max_calls, original.expires_at, original.subject_key_id, permit_id],
            )
            assert evidence_check(tenant, receipt_id) == "ok"
            cur.execute(f"UPDATE permits_permit SET {assignment} WHERE permit_id = %s", [permit_id])
        r = caller.invoke("clock.now")
        assert r.json()["reason_code"] == "permit_signature_invalid", (column, r.content)
        assert evidence_check(tenant, receipt_id).startswith("statement_mismatch:"), column


def evidence_check(tenant: Tenant, receipt_id: str) -> str:
    return str(tenant.agent_client.get(f"/v1/evidence/{receipt_id}").json()["verification"]["permit_signature"])


def test_a_quote_price_edited_after_signing_is_not_honoured(tenant: Tenant, demo: str) -> None:
    from billing.models import Wallet
    from tests import factories
    from tests.gateway_helpers import issue_permit

    factories.top_up(tenant.agent, 10)
    caller = Caller(tenant, issue_permit(tenant, tools=["clock.now"]))
    quote = tenant.agent_client.post(
        "/v1/quotes", {"wallet_id": tenant.agent.wallet_id, "tool": "clock.now"}, format="json"
    )
    assert quote.status_code == 201, quote.content
    quote_id = quote.json()["quote_id"]
    with connection.cursor() as cur:
        cur.execute("UPDATE permits_quote SET quoted_credits = 0.00000001 WHERE quote_id = %s", [quote_id])
    balance = Wallet.objects.get(pk=tenant.agent.wallet_id).balance
    r = caller.invoke("clock.now", quote_id=quote_id)
    assert r.status_code in (403, 409), r.content
    assert r.json()["reason_code"] == "quote_unavailable"
    assert Wallet.objects.get(pk=tenant.agent.wallet_id).balance == balance


def test_a_receipt_edited_after_signing_is_not_refunded(tenant: Tenant, operator_client: Any) -> None:
    from receipts.models import RefundReconciliation
    from tests import factories
    from tests.test_receipts import make_receipt

    receipt = make_receipt(tenant, outcome="failed_unrefunded", owed=True)
    # Redirect the refund to another wallet of the tenant through the receipt's column.
    sibling = factories.make_wallet(tenant.sponsor, "sibling")
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE receipts_receipt SET wallet_id = %s WHERE receipt_id = %s", [sibling.wallet_id, receipt.receipt_id]
        )
    r = operator_client.post(f"/v1/receipts/reconciliation/refunds/{receipt.receipt_id}/retry")
    assert r.status_code == 409, r.content
    assert r.json()["detail"]["error"] == "receipt_statement_mismatch"
    assert RefundReconciliation.objects.get(receipt_id=receipt.receipt_id).status == "pending"
    assert not LedgerEntry.objects.filter(kind="refund").exists()
