"""The billing HTTP API: wallets, ledger, pricing, charge, idempotency and tenant isolation."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db.models import Sum

from audit.models import AuditEvent
from billing.models import ChargeIdempotency, LedgerEntry, Wallet
from tests import factories
from tests.conftest import client_for

D = Decimal


def charge(client, wallet_id, key=None, **params):
    query = {"wallet_id": wallet_id, **params}
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    qs = "&".join(f"{k}={v}" for k, v in query.items())
    return client.post(f"/v1/billing/charge?{qs}", **headers)


def balance(wallet: Wallet) -> Decimal:
    wallet.refresh_from_db()
    return wallet.balance


@pytest.mark.django_db
def test_sponsor_creation_needs_an_operator_key(operator_client, tenant):
    r = tenant.sponsor_client.post("/v1/billing/wallets/sponsor", {"name": "x"}, format="json")
    assert r.status_code == 403
    assert r.json()["detail"]["error"] == "operator_key_required"

    r = operator_client.post(
        "/v1/billing/wallets/sponsor", {"name": "initech", "initial_credits": "250.5"}, format="json"
    )
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["wallet_id"].startswith("spn_")
    assert body["wallet_type"] == "sponsor"
    assert body["tenant_id"] == body["wallet_id"]
    assert body["balance"] == "250.50000000"
    assert body["daily_spent"] == "0.00000000"
    assert body["status"] == "active"
    entry = LedgerEntry.objects.get(account=body["wallet_id"])
    assert entry.kind == "provision"
    assert entry.counterparty == "mint"


@pytest.mark.django_db
def test_create_agent_and_child_wallets(tenant, operator_client):
    factories.top_up(tenant.sponsor, 100)
    r = tenant.sponsor_client.post(
        "/v1/billing/wallets/agent",
        {
            "parent_wallet_id": tenant.sponsor.wallet_id,
            "name": "bot",
            "initial_balance": "40",
            "budget": "500",
            "daily_limit": "50",
            "refill_threshold": "5",
            "refill_amount": "20",
        },
        format="json",
    )
    assert r.status_code == 201, r.content
    agent = r.json()
    assert agent["wallet_type"] == "agent"
    assert agent["wallet_id"].startswith("agt_")
    assert agent["balance"] == "40.00000000"
    assert agent["budget"] == "500.00000000"
    assert agent["refill_amount"] == "20.00000000"
    assert agent["parent_wallet_id"] == tenant.sponsor.wallet_id
    assert balance(tenant.sponsor) == D("60")

    # The agent's own key creates a child under it.
    key = factories.make_key(Wallet.objects.get(pk=agent["wallet_id"]))
    r = client_for(key.secret).post(
        "/v1/billing/wallets/agent",
        {"parent_wallet_id": agent["wallet_id"], "initial_balance": "15"},
        format="json",
    )
    assert r.status_code == 201, r.content
    child = r.json()
    assert child["wallet_type"] == "child"
    assert child["wallet_id"].startswith("chd_")

    # A child cannot have children; an uncovered initial balance is 402.
    r = operator_client.post("/v1/billing/wallets/agent", {"parent_wallet_id": child["wallet_id"]}, format="json")
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "parent_wallet_id"]
    r = tenant.sponsor_client.post(
        "/v1/billing/wallets/agent",
        {"parent_wallet_id": tenant.sponsor.wallet_id, "initial_balance": "60.00000001"},
        format="json",
    )
    assert r.status_code == 402
    detail = r.json()["detail"]
    assert detail["error"] == "insufficient_funds"
    assert detail["shortfall"] == "0.00000001"
    assert detail["wallet_id"] == tenant.sponsor.wallet_id


@pytest.mark.django_db
def test_create_agent_validation(tenant):
    r = tenant.sponsor_client.post(
        "/v1/billing/wallets/agent",
        {"parent_wallet_id": tenant.sponsor.wallet_id, "initial_balance": "-1", "refill_threshold": "3"},
        format="json",
    )
    assert r.status_code == 422
    locs = {tuple(item["loc"]) for item in r.json()["detail"]}
    assert ("body", "initial_balance") in locs


@pytest.mark.django_db
def test_get_and_list_wallets(tenant, other_tenant, operator_client):
    child = factories.make_wallet(tenant.agent, "sub", 3)
    r = tenant.sponsor_client.get(f"/v1/billing/wallets/{child.wallet_id}")
    assert r.status_code == 200
    assert r.json()["balance"] == "3.00000000"

    r = tenant.agent_client.get("/v1/billing/wallets")
    assert r.status_code == 200
    ids = [w["wallet_id"] for w in r.json()["items"]]
    assert ids == [tenant.agent.wallet_id, child.wallet_id]

    r = tenant.sponsor_client.get("/v1/billing/wallets?wallet_type=child")
    assert [w["wallet_id"] for w in r.json()["items"]] == [child.wallet_id]
    r = tenant.sponsor_client.get("/v1/billing/wallets?limit=1&offset=1")
    body = r.json()
    assert body["total"] == 3
    assert body["limit"] == 1
    assert body["offset"] == 1
    assert len(body["items"]) == 1

    r = operator_client.get("/v1/billing/wallets?wallet_type=sponsor")
    assert {w["wallet_id"] for w in r.json()["items"]} >= {tenant.sponsor.wallet_id, other_tenant.sponsor.wallet_id}

    r = tenant.sponsor_client.get("/v1/billing/wallets?wallet_type=bogus&limit=0")
    assert r.status_code == 422
    assert {tuple(i["loc"]) for i in r.json()["detail"]} == {("query", "wallet_type"), ("query", "limit")}

    # The daily spend figure in listings.
    factories.top_up(tenant.agent, 10)
    charge(tenant.agent_client, tenant.agent.wallet_id, service_category="compute", units="2")
    r = tenant.agent_client.get("/v1/billing/wallets")
    assert r.json()["items"][0]["daily_spent"] == "2.00000000"


@pytest.mark.django_db
def test_charge_and_ledger(tenant):
    factories.top_up(tenant.agent, 10)
    r = charge(
        tenant.agent_client,
        tenant.agent.wallet_id,
        service="search",
        units="4",
        request_path="/search",
        description="query",
    )
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["amount"] == "1.00000000"
    assert body["unit_price"] == "0.25000000"
    assert body["units"] == "4.00000000"
    assert body["balance"] == "9.00000000"
    assert body["service_category"] == "search"
    assert body["entry_id"].startswith("led_")
    assert body["correlation_id"] == r["X-Request-Id"]

    r = tenant.agent_client.get(f"/v1/billing/ledger/{tenant.agent.wallet_id}?limit=1")
    assert r.status_code == 200
    ledger = r.json()
    assert ledger["balance"] == "9.00000000"
    assert ledger["total"] == 2
    assert ledger["limit"] == 1
    [entry] = ledger["items"]
    assert entry["entry_id"] == body["entry_id"]
    assert entry["kind"] == "charge"
    assert entry["amount"] == "-1.00000000"
    assert entry["balance_after"] == "9.00000000"
    assert entry["counterparty"] == "revenue"
    assert entry["request_path"] == "/search"
    event = AuditEvent.objects.get(event="ledger.charge", wallet_id=tenant.agent.wallet_id)
    assert event.detail["entry_id"] == body["entry_id"]
    assert event.key_id == tenant.agent_key_id

    for bad in ("0", "-1", "abc", "201"):
        r = tenant.agent_client.get(f"/v1/billing/ledger/{tenant.agent.wallet_id}?limit={bad}")
        assert r.status_code == 422
        assert r.json()["detail"][0]["loc"] == ["query", "limit"]


@pytest.mark.django_db
def test_charge_validation(tenant):
    r = tenant.agent_client.post("/v1/billing/charge")
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["query", "wallet_id"]
    for units in ("0", "-2", "NaN", "x"):
        r = charge(tenant.agent_client, tenant.agent.wallet_id, units=units)
        assert r.status_code == 422, units
        assert r.json()["detail"][0]["loc"] == ["query", "units"]
    r = charge(tenant.agent_client, tenant.agent.wallet_id, service_category="teleport")
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["query", "service_category"]
    for key in ("x" * 256, "caf\u00e9", " padded"):
        r = charge(tenant.agent_client, tenant.agent.wallet_id, key=key)
        assert r.status_code == 422
        assert r.json()["detail"][0]["loc"] == ["header", "Idempotency-Key"]
    r = tenant.agent_client.post("/v1/billing/charge?wallet_id=" + tenant.agent.wallet_id)
    assert r.status_code == 402
    detail = r.json()["detail"]
    assert set(detail) == {"error", "message", "wallet_id", "balance", "required", "shortfall"}
    assert detail["required"] == "1.00000000"
    assert detail["balance"] == "0.00000000"


@pytest.mark.django_db
def test_charge_idempotency(tenant):
    factories.top_up(tenant.agent, 10)
    first = charge(tenant.agent_client, tenant.agent.wallet_id, key="order-1", service_category="compute", units="2")
    assert first.status_code == 200
    assert "Idempotent-Replayed" not in first
    again = charge(tenant.agent_client, tenant.agent.wallet_id, key="order-1", service_category="compute", units="2.0")
    assert again.status_code == 200
    assert again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert balance(tenant.agent) == D("8")

    # The sponsor's key sees the same key space: keys are scoped by wallet, not by caller.
    replay = charge(tenant.sponsor_client, tenant.agent.wallet_id, key="order-1", service_category="compute", units="2")
    assert replay.status_code == 200
    assert replay["Idempotent-Replayed"] == "true"

    reused = charge(tenant.agent_client, tenant.agent.wallet_id, key="order-1", service_category="compute", units="3")
    assert reused.status_code == 422
    assert reused.json()["detail"][0]["type"] == "idempotency_key_reused"
    assert reused.json()["detail"][0]["loc"] == ["header", "Idempotency-Key"]
    assert balance(tenant.agent) == D("8")
    assert ChargeIdempotency.objects.count() == 1
    assert LedgerEntry.objects.filter(wallet=tenant.agent, kind="charge").count() == 1


@pytest.mark.django_db
def test_refused_charge_does_not_burn_the_key(tenant):
    r = charge(tenant.agent_client, tenant.agent.wallet_id, key="k", units="5")
    assert r.status_code == 402
    assert not ChargeIdempotency.objects.exists()
    factories.top_up(tenant.agent, 5)
    r = charge(tenant.agent_client, tenant.agent.wallet_id, key="k", units="5")
    assert r.status_code == 200
    assert balance(tenant.agent) == 0


@pytest.mark.django_db
def test_pricing(tenant):
    r = tenant.agent_client.get("/v1/billing/pricing")
    assert r.status_code == 200
    body = r.json()
    prices = {p["service_category"]: p["credits_per_unit"] for p in body["categories"]}
    assert prices["compute"] == "1.00000000"
    assert set(prices) == {
        "compute",
        "data",
        "search",
        "storage",
        "messaging",
        "payments",
        "content",
        "tooling",
        "other",
    }
    assert client_for(None).get("/v1/billing/pricing").status_code == 401


@pytest.mark.django_db(transaction=True)
def test_cross_tenant_access_is_denied_and_changes_nothing(tenant, other_tenant):
    factories.top_up(other_tenant.agent, 10)
    factories.top_up(tenant.agent, 10)
    charge(tenant.agent_client, tenant.agent.wallet_id, units="1")
    victim = other_tenant.agent.wallet_id
    attacker = tenant.sponsor_client
    before = (
        LedgerEntry.objects.count(),
        AuditEvent.objects.filter(tenant_id=other_tenant.sponsor.wallet_id).count(),
    )

    assert attacker.get(f"/v1/billing/wallets/{victim}").json()["detail"]["error"] == "wallet_access_denied"
    for path in (f"/v1/billing/wallets/{victim}", f"/v1/billing/ledger/{victim}"):
        r = attacker.get(path)
        assert r.status_code == 403
    r = charge(attacker, victim, units="1")
    assert r.status_code == 403
    assert r.json()["detail"]["error"] == "wallet_access_denied"
    r = charge(attacker, victim, key="steal", units="1")
    assert r.status_code == 403
    r = attacker.post("/v1/billing/wallets/agent", {"parent_wallet_id": victim, "initial_balance": "5"}, format="json")
    assert r.status_code == 403
    # An agent cannot reach its sponsor (upwards) either.
    r = charge(tenant.agent_client, tenant.sponsor.wallet_id, units="1")
    assert r.status_code == 403
    # Unknown wallets look the same as foreign ones to wallet keys.
    assert attacker.get("/v1/billing/ledger/agt_doesnotexist").status_code == 403

    after = (
        LedgerEntry.objects.count(),
        AuditEvent.objects.filter(tenant_id=other_tenant.sponsor.wallet_id).count(),
    )
    assert after == before
    assert balance(other_tenant.agent) == D("10")
    assert not ChargeIdempotency.objects.filter(wallet_id=victim).exists()

    # Listings never show another tenant's wallets or entries.
    listed = tenant.sponsor_client.get("/v1/billing/wallets?limit=200").json()["items"]
    assert {w["tenant_id"] for w in listed} == {tenant.sponsor.wallet_id}
    own = tenant.sponsor_client.get(f"/v1/billing/ledger/{tenant.agent.wallet_id}?limit=200").json()["items"]
    own_ids = {e["entry_id"] for e in own}
    foreign = set(
        LedgerEntry.objects.filter(tenant_id=other_tenant.sponsor.wallet_id).values_list("entry_id", flat=True)
    )
    assert own_ids
    assert not own_ids & foreign
    assert LedgerEntry.objects.aggregate(t=Sum("amount"))["t"] == 0


@pytest.mark.django_db(transaction=True)
def test_velocity_freeze_over_http(tenant):
    factories.top_up(tenant.agent, 1500)
    assert (
        charge(tenant.agent_client, tenant.agent.wallet_id, service_category="compute", units="999").status_code == 200
    )
    r = charge(tenant.agent_client, tenant.agent.wallet_id, key="big", service_category="compute", units="2")
    assert r.status_code == 403
    assert r.json()["detail"]["error"] == "wallet_frozen"
    tenant.agent.refresh_from_db()
    assert tenant.agent.status == "frozen"
    r = tenant.agent_client.get(f"/v1/billing/wallets/{tenant.agent.wallet_id}")
    assert r.json()["status"] == "frozen"
    assert r.json()["frozen_reason"].startswith("velocity")
    r = charge(tenant.agent_client, tenant.agent.wallet_id, service_category="tooling", units="0.1")
    assert r.status_code == 403
    assert r.json()["detail"]["error"] == "wallet_frozen"
    assert balance(tenant.agent) == D("501")


@pytest.mark.django_db
def test_query_counts_on_lists_and_the_charge_path(tenant, django_assert_max_num_queries):
    for i in range(8):
        factories.make_wallet(tenant.agent, f"c{i}", 1)
    factories.top_up(tenant.agent, 10)
    client = tenant.sponsor_client
    client.get("/v1/billing/pricing")  # warm the key lookup path
    with django_assert_max_num_queries(4):
        r = client.get("/v1/billing/wallets?limit=200")
    assert r.json()["total"] == 10
    with django_assert_max_num_queries(4):
        r = client.get(f"/v1/billing/ledger/{tenant.agent.wallet_id}?limit=200")
    assert r.json()["total"] == len(r.json()["items"]) > 8
    # Key, wallet, transaction (2), key row (fast path and under the lock), price, lock, spend,
    # balance, entries, key row insert, audit (5: savepoint, head lock, event, head, release).
    with django_assert_max_num_queries(17):
        r = charge(client, tenant.agent.wallet_id, key="q1", service_category="tooling", units="1")
    assert r.status_code == 200
    # A replay takes no lock: key, wallet, transaction (2), key row.
    with django_assert_max_num_queries(5):
        r = charge(client, tenant.agent.wallet_id, key="q1", service_category="tooling", units="1")
    assert r["Idempotent-Replayed"] == "true"
