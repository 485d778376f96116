"""Day two in the console (issue 30): wallet settings (console and PATCH /v1/billing/wallets/{id}), tool price
changes with their history, key rotation and revocation reasons, audit search by actor, event and object id,
chain verification and a receipt's downloads. The pages themselves are driven in Chromium in
tests/test_console_browser.py; here the rules behind them, attacked as each caller they govern."""

from __future__ import annotations

import itertools
import json
import threading
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.db import connection
from django.test import Client

from access.models import APIKey
from audit.models import AuditEvent, ChainVerificationRecord
from billing.models import ToolPrice, ToolPriceChange, Wallet
from billing.services import tool_price_set, wallet_settings_change
from permits.models import PolicyBundle, Quote
from tests import factories
from tests.conftest import Tenant, client_for
from tests.test_billing_api import charge

D = Decimal
pytestmark = pytest.mark.django_db
_users = iter(range(1, 10_000))


def _staff(*permissions: str, superuser: bool = False) -> tuple[Client, Any]:
    users = get_user_model().objects
    name = f"op{next(_users)}"
    if superuser:
        user = users.create_superuser(name, "", "pw-for-tests-only")
    else:
        user = users.create_user(name, password="pw-for-tests-only", is_staff=True)
    for label in permissions:
        app_label, codename = label.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    client = Client()
    client.force_login(user)
    return client, user


def _patch(client: Any, wallet_id: str, **body: Any) -> Any:
    return client.patch(f"/v1/billing/wallets/{wallet_id}", body, format="json")


def _refresh(wallet: Wallet) -> Wallet:
    wallet.refresh_from_db()
    return wallet


# 1. Wallet settings -----------------------------------------------------------------------------------------


def test_the_parent_key_changes_a_childs_settings_audited_with_before_and_after(tenant: Tenant) -> None:
    r = _patch(tenant.sponsor_client, tenant.agent.wallet_id, name="bot 2", daily_limit="40", budget="500")
    assert r.status_code == 200, r.json()
    body = r.json()
    assert (body["name"], body["daily_limit"], body["budget"]) == ("bot 2", "40.00000000", "500.00000000")
    assert body["changes"]["daily_limit"] == {"before": None, "after": "40.00000000"}
    assert body["notices"] == []
    agent = _refresh(tenant.agent)
    assert (agent.name, agent.daily_limit, agent.budget) == ("bot 2", D(40), D(500))
    event = AuditEvent.objects.get(event="wallet.settings_changed", wallet_id=agent.wallet_id)
    assert event.key_id == tenant.sponsor_key_id
    assert event.detail["changes"]["name"] == {"before": "acme-agent", "after": "bot 2"}
    # The operator may change them too (raise included); an unchanged value is not a change.
    operator = client_for(factories.make_operator_key().secret)
    r = _patch(operator, agent.wallet_id, daily_limit="90", name="bot 2")
    assert r.status_code == 200
    assert list(r.json()["changes"]) == ["daily_limit"]


def test_an_agent_lowers_its_own_limits_but_never_raises_them(tenant: Tenant) -> None:
    wallet_settings_change(wallet=tenant.agent, changes={"daily_limit": D(50), "budget": D(100)})
    agent = tenant.agent_client
    assert _patch(agent, tenant.agent.wallet_id, daily_limit="30").status_code == 200
    for attack in ({"daily_limit": "31"}, {"daily_limit": None}, {"budget": "100.00000001"}, {"budget": None}):
        r = _patch(agent, tenant.agent.wallet_id, **attack)
        assert r.status_code == 403, attack
        assert r.json()["detail"]["error"] == "wallet_limit_raise_denied"
    # An auto-refill draws on the parent: adding one (or a bigger one) is a raise.
    r = _patch(agent, tenant.agent.wallet_id, refill_threshold="1", refill_amount="10")
    assert r.status_code == 403
    assert (_refresh(tenant.agent).daily_limit, tenant.agent.budget, tenant.agent.refill_amount) == (
        D(30),
        D(100),
        None,
    )
    # The sponsor's own key is held to the same rule on its own wallet; the operator is not.
    wallet_settings_change(wallet=tenant.sponsor, changes={"daily_limit": D(1000)})
    assert _patch(tenant.sponsor_client, tenant.sponsor.wallet_id, daily_limit="1001").status_code == 403
    assert _patch(tenant.sponsor_client, tenant.sponsor.wallet_id, daily_limit="900").status_code == 200


def test_an_agent_never_sets_its_child_above_its_own_line_nor_reaches_siblings_or_parents(tenant: Tenant) -> None:
    wallet_settings_change(wallet=tenant.agent, changes={"daily_limit": D(50)})
    child = factories.make_wallet(tenant.agent, "child")
    sibling = factories.make_wallet(tenant.sponsor, "sibling")
    agent = tenant.agent_client
    assert _patch(agent, child.wallet_id, daily_limit="50").status_code == 200
    r = _patch(agent, child.wallet_id, daily_limit="51")
    assert (r.status_code, r.json()["detail"]["error"]) == (403, "wallet_limit_raise_denied")
    assert _patch(agent, child.wallet_id, daily_limit=None).status_code == 403  # unlimited is above 50
    assert _refresh(child).daily_limit == D(50)
    # A sibling's and the parent's settings are out of reach.
    for target in (sibling, tenant.sponsor):
        r = _patch(agent, target.wallet_id, name="mine now")
        assert (r.status_code, r.json()["detail"]["error"]) == (403, "wallet_access_denied")
    # The child changes its parent? Out of reach too.
    child_client = client_for(factories.make_key(child).secret)
    assert _patch(child_client, tenant.agent.wallet_id, daily_limit="1000").status_code == 403
    assert _refresh(tenant.agent).daily_limit == D(50)


def test_settings_are_validated_as_at_creation(tenant: Tenant) -> None:
    sponsor = tenant.sponsor_client
    r = _patch(sponsor, tenant.agent.wallet_id, refill_threshold="5")
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "refill_amount"]
    r = _patch(sponsor, tenant.agent.wallet_id, daily_limit="-1")
    assert r.status_code == 422
    operator = client_for(factories.make_operator_key().secret)
    r = _patch(operator, tenant.sponsor.wallet_id, budget="10")
    assert (r.status_code, r.json()["detail"][0]["type"]) == (422, "sponsor_setting")
    r = _patch(operator, "agt_nosuchwallet", name="x")
    assert r.status_code == 404


def test_a_limit_under_the_days_spend_says_so_and_applies_from_the_next_charge(tenant: Tenant) -> None:
    factories.top_up(tenant.agent, 100)
    assert (
        charge(tenant.agent_client, tenant.agent.wallet_id, service_category="compute", units="10").status_code == 200
    )
    r = _patch(tenant.sponsor_client, tenant.agent.wallet_id, daily_limit="5")
    assert r.status_code == 200
    assert "already spent today" in r.json()["notices"][0]
    event = AuditEvent.objects.get(event="wallet.settings_changed", wallet_id=tenant.agent.wallet_id)
    assert event.detail["notices"]
    # A budget under the lifetime spend says so too; a limit of 0 on a wallet that spent nothing is no notice.
    r = _patch(tenant.sponsor_client, tenant.agent.wallet_id, budget="1")
    assert "lifetime spend" in r.json()["notices"][0]
    fresh = factories.make_wallet(tenant.sponsor, "fresh")
    assert _patch(tenant.sponsor_client, fresh.wallet_id, daily_limit="0", budget="0").json()["notices"] == []
    assert _patch(tenant.sponsor_client, tenant.agent.wallet_id, budget=None).status_code == 200
    r = charge(tenant.agent_client, tenant.agent.wallet_id, service_category="compute", units="1")
    assert (r.status_code, r.json()["detail"]["error"]) == (403, "daily_limit_exceeded")
    # Raised again (by the sponsor), the next charge goes through: the debit reads the limit at charge time.
    assert _patch(tenant.sponsor_client, tenant.agent.wallet_id, daily_limit="20").status_code == 200
    assert charge(tenant.agent_client, tenant.agent.wallet_id, service_category="compute", units="1").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_an_agent_racing_its_sponsors_lowering_never_ends_above_it(tenant: Tenant) -> None:
    """The sponsor lowers the agent's daily limit from 50 to 10 while the agent sets 40 (a lowering of the 50
    it read). The agent's rule is judged on the row it locked: run after the sponsor's change, 40 is a raise
    of 10 and is refused; run before it, the sponsor's 10 follows. Whatever the order, the limit ends at 10."""
    for _ in range(3):
        wallet_settings_change(wallet=tenant.agent, changes={"daily_limit": D(50)})
        results = _race(
            {
                "sponsor": lambda: _patch(tenant.sponsor_client, tenant.agent.wallet_id, daily_limit="10"),
                "agent": lambda: _patch(tenant.agent_client, tenant.agent.wallet_id, daily_limit="40"),
            }
        )
        assert results["sponsor"].status_code == 200
        assert results["agent"].status_code in (200, 403)
        assert _refresh(tenant.agent).daily_limit == D(10)
        # Each audited change's "before" is the value it replaced.
        events = AuditEvent.objects.filter(event="wallet.settings_changed", wallet_id=tenant.agent.wallet_id)
        changes = [e.detail["changes"]["daily_limit"] for e in events.order_by("seq")]
        for earlier, later in itertools.pairwise(changes):
            assert later["before"] == earlier["after"]


def _race(calls: dict[str, Any]) -> dict[str, Any]:
    """Run each call in its own thread, released together; their results by name."""
    results: dict[str, Any] = {}
    barrier = threading.Barrier(len(calls))

    def run(name: str) -> None:
        try:
            barrier.wait()
            results[name] = calls[name]()
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(name,)) for name in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_the_patch_is_documented_as_an_extension(anon_client: Any) -> None:
    operation = anon_client.get("/openapi.json").json()["paths"]["/v1/billing/wallets/{wallet_id}"]["patch"]
    assert operation["x-tollgate-extension"] is True
    assert operation["operationId"] == "billing_wallets_update_settings"


def test_console_settings_page_needs_its_permission_and_writes_history(tenant: Tenant) -> None:
    url = f"/admin/billing/wallet/{quote(tenant.agent.wallet_id)}/settings/"
    viewer, _ = _staff("billing.view_wallet")
    assert viewer.get(url).status_code == 403
    assert viewer.post(url, {"name": "x", "daily_limit": "1"}).status_code == 403
    assert (
        b"change-wallet-settings"
        not in viewer.get(f"/admin/billing/wallet/{quote(tenant.agent.wallet_id)}/change/").content
    )
    # With the permission but not "fund wallet": no auto-refill (it moves the parent's credits).
    client, user = _staff("billing.view_wallet", "billing.change_wallet_settings")
    assert (
        b"change-wallet-settings"
        in client.get(f"/admin/billing/wallet/{quote(tenant.agent.wallet_id)}/change/").content
    )
    r = client.post(url, {"name": "bot", "refill_threshold": "1", "refill_amount": "5"})
    assert r.status_code == 200
    assert b"fund wallet" in r.content
    r = client.post(url, {"name": "renamed", "budget": "70", "daily_limit": "7"})
    assert r.status_code == 302
    agent = _refresh(tenant.agent)
    assert (agent.name, agent.budget, agent.daily_limit) == ("renamed", D(70), D(7))
    event = AuditEvent.objects.get(event="wallet.settings_changed", wallet_id=agent.wallet_id)
    assert event.detail["actor"] == f"admin:{user.get_username()}"
    # An API change shows in the History too, with before and after.
    _patch(tenant.sponsor_client, agent.wallet_id, daily_limit="6")
    history = client.get(f"/admin/billing/wallet/{quote(agent.wallet_id)}/history/").content.decode()
    assert "Changed settings" in history
    assert tenant.sponsor_key_id in history
    assert "7.00000000" in history
    assert "6.00000000" in history


# 2. Tool prices ---------------------------------------------------------------------------------------------


def _priced_tool(name: str = "notes.append", credits: str = "0.5") -> None:
    from mcpgateway.services import tools_sync

    tools_sync(remote_tools=[{"name": name, "description": "Append a note.", "inputSchema": {}}])
    tool_price_set(tool=name, credits=D(credits), actor="test")


def test_a_price_changes_from_its_page_with_history_and_never_unpriced() -> None:
    _priced_tool()
    client, user = _staff(superuser=True)
    page = client.get("/admin/billing/toolprice/notes.append/change/")
    assert page.status_code == 200  # was KeyError: 'tool'
    r = client.post("/admin/billing/toolprice/notes.append/change/", {"credits": "0.75"})
    assert r.status_code == 302
    assert ToolPrice.objects.get(tool="notes.append").credits == D("0.75")
    change = ToolPriceChange.objects.filter(tool="notes.append").first()
    assert change is not None
    assert (change.old_credits, change.new_credits, change.actor) == (D("0.5"), D("0.75"), f"admin:{user.username}")
    assert not AuditEvent.objects.filter(event="pricing.tool_price_removed").exists()
    html = client.get("/admin/billing/toolprice/notes.append/change/").content.decode()
    assert "price-history" in html
    assert "0.75" in html
    # The tool's page and the price list link to the change page.
    tool_page = client.get(f"/admin/mcpgateway/tool/{quote('notes.append')}/change/").content.decode()
    assert "/admin/billing/toolprice/notes.append/change/" in tool_page
    assert "/admin/billing/toolprice/notes.append/change/" in client.get("/admin/billing/toolprice/").content.decode()
    # Every change is listed, read-only.
    changes = client.get("/admin/billing/toolpricechange/").content.decode()
    assert f"admin:{user.username}" in changes
    assert client.get(f"/admin/billing/toolpricechange/{quote(change.pk)}/change/").status_code == 200
    assert client.post("/admin/billing/toolpricechange/add/", {}).status_code == 403


def test_manage_py_writes_the_same_history_and_quotes_keep_their_price(tenant: Tenant) -> None:
    _priced_tool()
    factories.top_up(tenant.agent, 10)
    r = tenant.agent_client.post(
        "/v1/quotes", {"wallet_id": tenant.agent.wallet_id, "tool": "notes.append"}, format="json"
    )
    assert r.status_code == 201, r.json()
    call_command("set_tool_price", "notes.append", "2")
    change = ToolPriceChange.objects.filter(tool="notes.append").first()
    assert change is not None
    assert (change.old_credits, change.new_credits) == (D("0.5"), D(2))
    assert change.actor == "manage.py set_tool_price"
    quote_row = Quote.objects.get(quote_id=r.json()["quote_id"])
    assert quote_row.quoted_credits == D("0.5")
    assert quote_row.signed_statement["quoted_credits"] == "0.50000000"


# 3. Keys: rotation and revocation reasons ----------------------------------------------------------------------

ROTATE = ("access.view_apikey", "access.add_apikey", "billing.fund_wallet", "access.revoke_key")


def test_rotating_a_key_in_the_console_reveals_the_successor_once(tenant: Tenant) -> None:
    data = {"action": "rotate_selected", "_selected_action": [tenant.agent_key_id]}
    # Without every permission rotation needs, it is not offered and does nothing.
    partial, _ = _staff("access.view_apikey", "access.revoke_key")
    assert b'value="rotate_selected"' not in partial.get("/admin/access/apikey/").content
    partial.post("/admin/access/apikey/", {**data, "post": "yes", "reason": "leaked"})
    assert APIKey.objects.filter(rotated_from=tenant.agent_key_id).count() == 0

    client, user = _staff(*ROTATE)
    page = client.post("/admin/access/apikey/", data)
    assert page.status_code == 200
    assert b'name="reason"' in page.content
    r = client.post("/admin/access/apikey/", {**data, "post": "yes", "reason": "leaked in CI logs"})
    assert r.status_code == 302
    new = APIKey.objects.get(rotated_from=tenant.agent_key_id)
    reveal = client.get(r["Location"])
    assert "no-store" in reveal["Cache-Control"]
    secret = reveal.content.decode().split('id="api-key-secret"')[1].split(">")[1].split("<")[0]
    assert secret.startswith(f"tg_{new.key_id}_")
    assert secret not in client.get(r["Location"]).content.decode()  # once
    assert client_for(secret).get(f"/v1/billing/wallets/{tenant.agent.wallet_id}").status_code == 200
    old = APIKey.objects.get(pk=tenant.agent_key_id)
    assert (old.status, old.revoke_reason) == ("revoked", "leaked in CI logs")
    event = AuditEvent.objects.get(event="api_key.rotated")
    assert event.detail["actor"] == f"admin:{user.get_username()}"
    assert event.endpoint is None


def test_revocations_ask_for_a_reason_and_store_it(tenant: Tenant) -> None:
    client, _ = _staff("access.view_apikey", "access.revoke_key")
    data = {"action": "revoke_selected", "_selected_action": [tenant.agent_key_id], "post": "yes"}
    for reason in ("", "  ", "x" * 201):
        r = client.post("/admin/access/apikey/", {**data, "reason": reason})
        assert r.status_code == 200, reason
        assert b"errorlist" in r.content, reason
        assert APIKey.objects.get(pk=tenant.agent_key_id).status == "active"
    client.post("/admin/access/apikey/", {**data, "reason": "contractor left"})
    key = APIKey.objects.get(pk=tenant.agent_key_id)
    assert (key.status, key.revoke_reason) == ("revoked", "contractor left")
    event = AuditEvent.objects.filter(event="api_key.revoked", wallet_id=tenant.agent.wallet_id).first()
    assert event is not None
    assert event.detail["reason"] == "contractor left"
    assert not AuditEvent.objects.filter(detail__reason="operator_console").exists()


# 7. Audit search ----------------------------------------------------------------------------------------------


def test_audit_events_are_found_by_actor_event_and_object_id(tenant: Tenant, operator_client: Any) -> None:
    from billing.services import wallet_freeze

    wallet_freeze(wallet=tenant.agent, reason="check", actor="admin:operator")
    client, _ = _staff("audit.view_auditevent", "permits.view_policybundle", "permits.add_policybundle", superuser=True)
    r = client.post(
        "/admin/permits/policybundle/add/",
        {"wallet": tenant.agent.wallet_id, "name": "p", "enabled": "on", "tools_mode": "any",
         "categories_mode": "any", "servers_mode": "any", "max_credits_per_call": "", "max_daily_credits": ""},
    )  # fmt: skip
    assert r.status_code == 302, r.content.decode()[:2000]
    policy = PolicyBundle.objects.get(wallet=tenant.agent)
    created = AuditEvent.objects.get(event="policy.created")
    assert created.endpoint == "/admin/permits/policybundle/add/"  # the console, not /v1/policies

    def found(term: str) -> str:
        return client.get("/admin/audit/auditevent/", {"q": term}).content.decode()

    frozen = AuditEvent.objects.get(event="wallet.frozen")
    assert frozen.event_id in found("admin:operator")
    assert frozen.event_id in found("wallet.frozen")
    assert created.event_id in found(policy.policy_id)
    assert created.event_id not in found("wallet.frozen")

    # The API filters the same way.
    def listed(**params: str) -> list[str]:
        r = operator_client.get("/v1/audit/events", params)
        assert r.status_code == 200, r.json()
        return [item["event_id"] for item in r.json()["items"]]

    assert listed(actor="admin:operator") == [frozen.event_id]
    assert listed(object_id=policy.policy_id) == [created.event_id]
    assert frozen.event_id in listed(object_id=tenant.agent.wallet_id)
    assert listed(actor="admin:nobody") == []
    # A wallet key sees only its reach, filters or not.
    other = factories.make_wallet(tenant.sponsor, "other")
    client_other = client_for(factories.make_key(other).secret)
    assert client_other.get("/v1/audit/events", {"object_id": policy.policy_id}).json()["items"] == []


# 8. Chain verification and receipt downloads -------------------------------------------------------------------


def test_chain_verification_from_the_console_records_and_shows_the_checkpoint(tenant: Tenant) -> None:
    client, user = _staff("audit.view_chainhead", "audit.verify_chain")
    r = client.post(
        "/admin/audit/chainhead/", {"action": "verify_selected", "_selected_action": [tenant.sponsor.wallet_id]}
    )
    assert r.status_code == 200
    page = r.content.decode()
    assert "chain-valid" in page
    assert "chain-checkpoint" in page
    record = ChainVerificationRecord.objects.get(chain=tenant.sponsor.wallet_id)
    assert record.valid
    event = AuditEvent.objects.get(event="audit.chain_verified")
    assert event.detail == {
        **event.detail,
        "chain": tenant.sponsor.wallet_id,
        "valid": True,
        "actor": f"admin:{user.username}",
    }


def test_a_receipts_page_offers_the_portable_receipt_and_the_evidence_bundle(tenant: Tenant) -> None:
    from receipts.verify import verify_portable
    from tests.test_receipts import make_receipt

    receipt = make_receipt(tenant)
    client, _ = _staff("receipts.view_receipt")
    page = client.get(f"/admin/receipts/receipt/{quote(receipt.receipt_id)}/change/").content.decode()
    assert "download-portable" in page
    assert "download-evidence" in page
    portable = client.get(f"/admin/receipts/receipt/{quote(receipt.receipt_id)}/portable.json")
    assert portable.status_code == 200
    assert "attachment" in portable["Content-Disposition"]
    assert (
        json.loads(portable.content) == tenant.sponsor_client.get(f"/v1/receipts/{receipt.receipt_id}/portable").json()
    )
    assert verify_portable(json.loads(portable.content)).valid
    evidence = client.get(f"/admin/receipts/receipt/{quote(receipt.receipt_id)}/evidence.json")
    assert json.loads(evidence.content)["receipt"]["receipt_id"] == receipt.receipt_id
    nobody, _ = _staff("billing.view_wallet")
    assert nobody.get(f"/admin/receipts/receipt/{quote(receipt.receipt_id)}/portable.json").status_code == 403


def test_the_actor_and_object_id_filters_are_index_scans(tenant: Tenant) -> None:
    """Every branch of the filters has an index (the GIN index on the detail, the indexed columns): with
    sequential scans priced out, PostgreSQL finds a plan that does not read the whole table."""
    from audit.selectors import actor_q, object_id_q

    for q in (actor_q("admin:operator"), object_id_q("pol_x")):
        sql, params = AuditEvent.objects.filter(q).order_by().query.sql_with_params()
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute(f"EXPLAIN {sql}", params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        assert "Seq Scan" not in plan, plan
        assert "Filter:" not in plan, plan  # no index walked end to end with the condition as a filter
        assert "Bitmap Index Scan" in plan, plan
