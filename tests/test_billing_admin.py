"""The operator console moves money and sets prices through the services, each audited."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model

from audit.models import AuditEvent
from billing import selectors
from billing.models import LedgerEntry
from tests import factories

D = Decimal
CHANGELIST = "/admin/billing/wallet/"


@pytest.fixture
def admin_client(client, db):
    user = get_user_model().objects.create_superuser("root", "", "pw-for-tests-only")
    client.force_login(user)
    return client


def act(admin_client, action, wallets, **form):
    data = {"action": action, "_selected_action": [w.pk for w in wallets], **form}
    return admin_client.post(CHANGELIST, data)


@pytest.mark.django_db
def test_admin_provision_fund_freeze_unfreeze_close(admin_client):
    sponsor = factories.make_sponsor("acme")
    agent = factories.make_wallet(sponsor, "bot")

    # Without "apply" the action asks for the amount.
    page = act(admin_client, "provision_credits", [sponsor])
    assert page.status_code == 200
    assert b'name="amount"' in page.content

    r = act(admin_client, "provision_credits", [sponsor], apply="1", amount="500", description="pilot")
    assert r.status_code == 302
    r = act(admin_client, "fund_from_parent", [agent], apply="1", amount="120")
    assert r.status_code == 302
    sponsor.refresh_from_db()
    agent.refresh_from_db()
    assert (sponsor.balance, agent.balance) == (D("380"), D("120"))

    act(admin_client, "freeze_wallets", [agent], apply="1", reason="investigation")
    agent.refresh_from_db()
    assert agent.status == "frozen"
    assert agent.frozen_reason == "investigation"
    act(admin_client, "unfreeze_wallets", [agent])
    agent.refresh_from_db()
    assert agent.status == "active"
    page = act(admin_client, "close_wallets", [agent])
    assert page.status_code == 200  # the confirmation page, listing balances
    assert b"Close these wallets?" in page.content
    assert b"120" in page.content
    agent.refresh_from_db()
    assert agent.status == "active"
    act(admin_client, "close_wallets", [agent], post="yes")
    agent.refresh_from_db()
    sponsor.refresh_from_db()
    assert agent.status == "closed"
    assert agent.balance == 0
    assert sponsor.balance == D("500")

    events = list(AuditEvent.objects.filter(tenant_id=sponsor.wallet_id).values_list("event", "detail"))
    names = [name for name, _ in events]
    for expected in ("ledger.provision", "ledger.fund", "wallet.frozen", "wallet.unfrozen", "wallet.closed"):
        assert expected in names
    assert any(detail.get("actor") == "admin:root" for _, detail in events)
    assert selectors.account_balance("mint") == D("-500")


@pytest.mark.django_db
def test_admin_refusal_is_reported_not_applied(admin_client):
    sponsor = factories.make_sponsor("acme", 10)
    agent = factories.make_wallet(sponsor, "bot")
    r = act(admin_client, "fund_from_parent", [agent], apply="1", amount="11")
    assert r.status_code == 302
    agent.refresh_from_db()
    assert agent.balance == 0
    r = admin_client.get(CHANGELIST)
    assert b"insufficient_funds" in r.content


@pytest.mark.django_db
def test_admin_prices_and_read_only_ledger(admin_client):
    from billing.models import ToolPrice
    from mcpgateway.services import tools_sync

    tools_sync(remote_tools=[{"name": "notes.append", "description": "append", "inputSchema": {"type": "object"}}])
    # A typo is not a tool: nothing is priced or published.
    r = admin_client.post("/admin/billing/toolprice/add/", {"tool": "notes.apend", "credits": "0.5"})
    assert r.status_code == 200
    assert b"Select a valid choice" in r.content
    assert not ToolPrice.objects.filter(tool="notes.apend").exists()
    r = admin_client.post("/admin/billing/toolprice/add/", {"tool": "notes.append", "credits": "0.5"})
    assert r.status_code == 302, r.content[:500]
    assert selectors.tool_price("notes.append") == D("0.5")
    # Prices can be removed (through the audited service).
    r = admin_client.post("/admin/billing/toolprice/notes.append/delete/", {"post": "yes"})
    assert r.status_code == 302, r.content[:500]
    assert selectors.tool_price("notes.append") is None
    assert AuditEvent.objects.filter(event="pricing.tool_price_removed", tool="notes.append").count() == 1
    r = admin_client.post("/admin/billing/toolprice/add/", {"tool": "notes.append", "credits": "0.5"})
    assert r.status_code == 302
    r = admin_client.post("/admin/billing/serviceprice/compute/change/", {"credits_per_unit": "2"})
    assert r.status_code == 302, r.content[:500]
    assert selectors.price_for_category("compute") == D("2")
    assert AuditEvent.objects.filter(event__startswith="pricing.").count() == 4

    factories.make_sponsor("acme", 10)
    entry = LedgerEntry.objects.first()
    assert entry is not None
    assert admin_client.get("/admin/billing/ledgerentry/").status_code == 200
    assert admin_client.get(f"/admin/billing/ledgerentry/{quote(entry.pk)}/change/").status_code == 200
    assert admin_client.get("/admin/billing/ledgerentry/add/").status_code == 403


@pytest.mark.django_db
def test_admin_creates_api_keys_through_the_service(admin_client):
    from access.models import APIKey

    sponsor = factories.make_sponsor("acme")
    r = admin_client.post("/admin/access/apikey/add/", {"wallet": sponsor.pk, "name": "console"})
    assert r.status_code == 302, r.content[:300]  # post/redirect/get
    key = APIKey.objects.get(wallet_id=sponsor.wallet_id, name="console")
    assert r["Location"] == f"/admin/access/apikey/{key.key_id}/secret/"
    reveal = admin_client.get(r["Location"])
    assert reveal.status_code == 200
    assert "no-store" in reveal["Cache-Control"]
    assert b"api-key-secret" in reveal.content
    assert b"copy-secret" in reveal.content
    secret = reveal.content.decode().split('id="api-key-secret"', 1)[1].split(">", 1)[1].split("<", 1)[0]
    assert secret.startswith(f"tg_{key.key_id}_")
    # Reloading shows nothing and mints nothing.
    again = admin_client.get(r["Location"])
    assert b"already shown" in again.content
    assert secret.encode() not in again.content
    assert APIKey.objects.filter(wallet_id=sponsor.wallet_id).count() == 1
    # The stored key works with the secret shown once.
    from tests.conftest import client_for

    assert client_for(secret).get(f"/v1/billing/wallets/{sponsor.pk}").status_code == 200


@pytest.mark.django_db
def test_operator_keys_are_an_explicit_confirmed_choice(admin_client):
    from access.models import APIKey

    before = APIKey.objects.filter(wallet_id__isnull=True).count()
    r = admin_client.post("/admin/access/apikey/add/", {"wallet": "", "name": "root"})
    assert r.status_code == 200
    assert b"Choose a wallet" in r.content
    r = admin_client.post("/admin/access/apikey/add/", {"wallet": "", "name": "root", "operator_key": "on"})
    assert b"Confirm that this key has full access" in r.content
    assert APIKey.objects.filter(wallet_id__isnull=True).count() == before
    r = admin_client.post(
        "/admin/access/apikey/add/",
        {"wallet": "", "name": "root", "operator_key": "on", "confirm_operator_key": "on"},
    )
    assert r.status_code == 302
    assert APIKey.objects.filter(wallet_id__isnull=True).count() == before + 1


@pytest.mark.django_db
def test_console_creates_a_sponsor_and_an_agent_through_the_services(admin_client):
    from billing.models import Wallet

    r = admin_client.get("/admin/billing/wallet/add/")
    assert r.status_code == 200
    assert b"Create a wallet" in r.content
    r = admin_client.post("/admin/billing/wallet/add/", {"kind": "sponsor", "name": "acme", "amount": "1000"})
    assert r.status_code == 302, r.content[:800]
    sponsor = Wallet.objects.get(name="acme")
    assert sponsor.wallet_type == "sponsor"
    assert sponsor.balance == D("1000")
    assert r["Location"] == f"/admin/billing/wallet/{quote(sponsor.pk)}/change/"
    assert admin_client.get(r["Location"]).status_code == 200
    r = admin_client.post(
        "/admin/billing/wallet/add/",
        {"kind": "agent", "parent": sponsor.pk, "name": "bot", "amount": "100", "budget": "500",
         "daily_limit": "50", "refill_threshold": "10", "refill_amount": "25"},
    )  # fmt: skip
    assert r.status_code == 302, r.content[:800]
    agent = Wallet.objects.get(name="bot")
    assert (agent.parent_id, agent.balance, agent.budget, agent.daily_limit) == (
        sponsor.pk,
        D("100"),
        D("500"),
        D("50"),
    )
    assert (agent.refill_threshold, agent.refill_amount) == (D("10"), D("25"))
    sponsor.refresh_from_db()
    assert sponsor.balance == D("900")
    kinds = sorted(LedgerEntry.objects.filter(wallet__in=[sponsor, agent]).values_list("kind", flat=True))
    assert kinds == ["fund", "fund", "provision"]
    created = AuditEvent.objects.filter(event="wallet.created").order_by("seq")
    assert [e.detail.get("actor") for e in created] == ["admin:root", "admin:root"]
    # A refused creation (the parent cannot cover it) shows the reason and writes nothing.
    r = admin_client.post(
        "/admin/billing/wallet/add/", {"kind": "agent", "parent": sponsor.pk, "name": "big", "amount": "5000"}
    )
    assert r.status_code == 200
    assert b"insufficient_funds" in r.content
    assert not Wallet.objects.filter(name="big").exists()


@pytest.mark.django_db
def test_wallet_creation_needs_its_permissions(client):
    from django.contrib.auth.models import Permission

    from billing.models import Wallet

    user = get_user_model().objects.create_user("clerk", password="pw-for-tests-only", is_staff=True)
    client.force_login(user)
    assert client.get("/admin/billing/wallet/add/").status_code == 403
    user.user_permissions.add(
        Permission.objects.get(codename="add_wallet"), Permission.objects.get(codename="view_wallet")
    )
    client.force_login(get_user_model().objects.get(pk=user.pk))
    r = client.post("/admin/billing/wallet/add/", {"kind": "sponsor", "name": "rich", "amount": "1000000"})
    assert r.status_code == 200
    assert b"provision credits" in r.content
    assert not Wallet.objects.filter(name="rich").exists()
    r = client.post("/admin/billing/wallet/add/", {"kind": "sponsor", "name": "empty", "amount": "0"})
    assert r.status_code == 302
    empty = Wallet.objects.get(name="empty")
    assert empty.balance == 0
    # An auto-refill funds the wallet from its parent on later charges: the permission that moves money.
    refilled = {
        "kind": "agent",
        "parent": empty.pk,
        "name": "bot",
        "amount": "0",
        "refill_threshold": "1",
        "refill_amount": "50",
    }
    r = client.post("/admin/billing/wallet/add/", refilled)
    assert r.status_code == 200
    assert b"fund wallet" in r.content
    assert not Wallet.objects.filter(name="bot").exists()
    user.user_permissions.add(Permission.objects.get(codename="fund_wallet"))
    client.force_login(get_user_model().objects.get(pk=user.pk))
    assert client.post("/admin/billing/wallet/add/", refilled).status_code == 302
    assert Wallet.objects.get(name="bot").refill_amount == 50


@pytest.mark.django_db
def test_the_wallet_pages_api_keys_link_lists_that_wallets_keys(admin_client):
    """The keys are access's, with a plain wallet id: the wallet page's "API keys" link filters on it."""
    import html
    import re

    sponsor = factories.make_sponsor("acme")
    agent = factories.make_wallet(sponsor, "bot")
    mine, other = factories.make_key(agent, "mine"), factories.make_key(sponsor, "other")
    page = admin_client.get(f"/admin/billing/wallet/{quote(agent.pk)}/change/").content.decode()
    (link,) = re.findall(r'href="(/admin/access/apikey/\?[^"]*)"', page)
    listing = admin_client.get(html.unescape(link))
    assert listing.status_code == 200
    assert mine.key.key_id in listing.content.decode()
    assert other.key.key_id not in listing.content.decode()
