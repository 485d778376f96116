"""A key below a frozen wallet reads that wallet's figures through a refusal (adversarial review).

A velocity freeze's reason holds the spend of the frozen wallet's whole subtree ("spend in the last hour
would reach ..."). A refusal by an ancestor outside the caller's reach keeps its code and the ancestor's
id, not its figures (decisions.md, Money: ``billing.services.refusal_for_viewer``). The priced charge and
call paths did that; the free call and the creation or funding of a wallet below a frozen one did not.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from billing.exceptions import VelocityLimitExceeded, WalletFrozen
from billing.models import Wallet
from billing.services import tool_price_set, wallet_freeze_for_velocity, wallet_fund
from common.ids import new_id
from mcpgateway import services
from mcpgateway.models import Action
from tests import factories
from tests.conftest import Tenant, client_for
from tests.gateway_helpers import tools_call_body

pytestmark = pytest.mark.django_db


def _velocity_freeze(wallet: Wallet) -> None:
    exc = VelocityLimitExceeded(
        wallet_id=wallet.wallet_id, window="hour", spent=Decimal("987.65"), amount=Decimal("20"), limit=Decimal("1000")
    )
    assert wallet_freeze_for_velocity(exc=exc)
    assert Wallet.objects.get(pk=wallet.pk).frozen_reason.startswith("velocity:")


def _create_below(client: Any, parent: Wallet) -> Any:
    return client.post(
        "/v1/billing/wallets/agent", {"parent_wallet_id": parent.wallet_id, "name": "kid"}, format="json"
    )


def test_a_free_call_below_a_velocity_frozen_agent_hides_the_agents_figures(tenant: Tenant, settings: Any) -> None:
    settings.ENABLE_DOGFOOD_TOOL = True
    services.dogfood_tool_register()
    tool_price_set(tool=services.DOGFOOD_TOOL, credits=Decimal("0"))  # a free tool: no debit, the status check only
    child = factories.make_wallet(tenant.agent, "kid", balance=1)
    child_key = factories.make_key(Wallet.objects.get(pk=child.wallet_id))
    r = tenant.agent_client.post(
        "/v1/permits",
        {"wallet_id": child.wallet_id, "allowed_tools": ["*"], "max_credits": "5"},
        format="json",
        HTTP_IDEMPOTENCY_KEY=new_id("pk"),
    )
    assert r.status_code == 201, r.content
    _velocity_freeze(Wallet.objects.get(pk=tenant.agent.pk))  # the agent's subtree spend froze it

    body = tools_call_body(services.DOGFOOD_TOOL, {"text": "x"}, permit_id=r.json()["permit_id"])
    answer = client_for(child_key.secret).post("/mcp/messages", body, format="json").json()

    text = str(answer)
    assert "wallet_frozen" in text, answer
    assert tenant.agent.wallet_id in text, answer  # the child may learn which wallet stops it ...
    assert "frozen_reason" not in text, answer  # ... not that wallet's spend
    assert "velocity:" not in text, answer
    stored = Action.objects.get(wallet_id=child.wallet_id)  # the denial kept for replay and the receipt
    assert stored.state == "denied"
    assert "velocity:" not in str(stored.response), stored.response


def test_an_agent_creating_below_itself_does_not_see_its_frozen_sponsors_figures(tenant: Tenant) -> None:
    _velocity_freeze(Wallet.objects.get(pk=tenant.sponsor.pk))
    r = _create_below(tenant.agent_client, tenant.agent)
    assert r.status_code == 403, r.content
    detail = r.json()["detail"]
    assert detail["error"] == "wallet_frozen"
    assert detail["wallet_id"] == tenant.sponsor.wallet_id
    assert "frozen_reason" not in detail, detail


def test_a_caller_whose_reach_holds_the_frozen_wallet_still_reads_its_reason(
    tenant: Tenant, operator_client: Any
) -> None:
    """The sponsor's own key and the operator read the sponsor; an agent frozen itself reads its own reason."""
    sibling = factories.make_wallet(tenant.sponsor, "sibling")
    sibling_key = factories.make_key(Wallet.objects.get(pk=sibling.pk))
    _velocity_freeze(Wallet.objects.get(pk=sibling.pk))
    _velocity_freeze(Wallet.objects.get(pk=tenant.sponsor.pk))
    for client in (tenant.sponsor_client, operator_client):
        r = _create_below(client, tenant.agent)
        assert r.status_code == 403, r.content
        assert r.json()["detail"]["wallet_id"] == tenant.sponsor.wallet_id
        assert r.json()["detail"]["frozen_reason"].startswith("velocity:"), r.json()

    r = _create_below(client_for(sibling_key.secret), sibling)
    assert r.status_code == 403, r.content
    assert r.json()["detail"]["wallet_id"] == sibling.wallet_id
    assert r.json()["detail"]["frozen_reason"].startswith("velocity:"), r.json()


def test_funding_below_a_frozen_ancestor_hides_the_ancestors_figures_from_a_lower_key(tenant: Tenant) -> None:
    child = factories.make_wallet(tenant.agent, "kid")
    factories.top_up(tenant.agent, 5)
    _velocity_freeze(Wallet.objects.get(pk=tenant.sponsor.pk))
    agent, target = Wallet.objects.get(pk=tenant.agent.pk), Wallet.objects.get(pk=child.pk)

    with pytest.raises(WalletFrozen) as by_agent:
        wallet_fund(source=agent, target=target, amount=1, actor_key_id=tenant.agent_key_id)
    assert by_agent.value.extra == {"wallet_id": tenant.sponsor.wallet_id}

    with pytest.raises(WalletFrozen) as by_console:
        wallet_fund(source=agent, target=target, amount=1, actor="admin:ops")
    assert by_console.value.extra["frozen_reason"].startswith("velocity:")
