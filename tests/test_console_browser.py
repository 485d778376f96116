"""The console in Chromium at 1366x768: lists readable without horizontal scrolling, links between related
objects, the index summary, and the first job of a new operator (a sponsor and an agent wallet, a key)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model

from access import login_throttle
from billing.models import APIKey, Wallet
from tests.browser import browser_page, require_chromium, screenshot, wait_for
from tests.conftest import make_tenant
from tests.test_receipts import make_receipt

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
VIEWPORT = {"width": 1366, "height": 768}


def _login(page: Any, url: str, path: str) -> None:
    page.goto(f"{url}/admin/login/?next={path}")
    page.fill("#id_username", "root")
    page.fill("#id_password", "pw-for-tests-only")
    page.click("input[type=submit]")


def _no_horizontal_scroll(page: Any) -> None:
    width = page.evaluate("document.scrollingElement.scrollWidth")
    assert width <= VIEWPORT["width"], f"{page.url} is {width}px wide"


def test_lists_summary_and_links_at_1366(live_server: Any) -> None:
    require_chromium()
    get_user_model().objects.create_superuser("root", "", "pw-for-tests-only")
    tenant = make_tenant("glance")
    receipt = make_receipt(tenant, outcome="delivery_uncertain")
    with browser_page(viewport=VIEWPORT) as page:
        _login(page, live_server.url, "/admin/")
        page.wait_for_selector("#console-summary")
        assert page.inner_text("#summary-uncertain") == "0"  # receipts made directly: no uncertain action
        assert "glance" in page.inner_text("#summary-tenants")
        screenshot(page, "console-index-summary")
        for path, artifact in (
            ("/admin/receipts/receipt/", "console-receipts"),
            ("/admin/billing/ledgerentry/", "console-ledger"),
            ("/admin/billing/wallet/", "console-wallets"),
            ("/admin/billing/apikey/", "console-keys"),
        ):
            page.goto(f"{live_server.url}{path}")
            page.wait_for_selector("#result_list")
            _no_horizontal_scroll(page)
            screenshot(page, artifact)
        # Receipts show tool, outcome and credits; newest first.
        page.goto(f"{live_server.url}/admin/receipts/receipt/")
        row = page.inner_text("#result_list tbody tr:first-child")
        assert receipt.tool in row
        assert "Delivery Uncertain" in row
        # A wallet links to its ledger, keys, children, permits and receipts.
        page.goto(f"{live_server.url}/admin/billing/wallet/{quote(tenant.agent.wallet_id)}/change/")
        wait_for(page, ".field-related a:text-is('ledger')").click()
        page.wait_for_selector("#result_list")
        assert tenant.agent.wallet_id in page.inner_text("#result_list")
        page.go_back()
        wait_for(page, ".field-related a:text-is('receipts')").click()
        page.wait_for_selector("#result_list")
        assert receipt.receipt_id in page.inner_text("#result_list")
        # A receipt links to its action, ledger entry and audit event.
        page.goto(f"{live_server.url}/admin/receipts/receipt/{quote(receipt.receipt_id)}/change/")
        wait_for(page, ".field-related a:text-is('audit event')").click()
        page.wait_for_selector("#result_list")
        assert receipt.audit_event_id in page.inner_text("#result_list")


def test_a_new_operator_creates_a_tenant_and_a_key(live_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    require_chromium()
    # Playwright's sync API runs an event loop in this thread; the ORM checks below are plain reads.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    get_user_model().objects.create_superuser("root", "", "pw-for-tests-only")
    with browser_page(viewport=VIEWPORT) as page:
        _login(page, live_server.url, "/admin/billing/wallet/add/")
        page.wait_for_selector("#wallet-create")
        page.check("input[name=kind][value=sponsor]")
        page.fill("#id_name", "acme")
        page.fill("#id_amount", "1000")
        page.click("#create-wallet")
        page.wait_for_selector(".messagelist .success")
        sponsor = Wallet.objects.get(name="acme")
        page.goto(f"{live_server.url}/admin/billing/wallet/add/")
        page.check("input[name=kind][value=agent]")
        page.select_option("#id_parent", sponsor.wallet_id)
        page.fill("#id_name", "acme-bot")
        page.fill("#id_amount", "100")
        page.fill("#id_daily_limit", "25")
        page.click("#create-wallet")
        page.wait_for_selector(".messagelist .success")
        agent = Wallet.objects.get(name="acme-bot")
        assert (agent.balance, agent.daily_limit) == (100, 25)
        screenshot(page, "console-wallet-created")
        page.goto(f"{live_server.url}/admin/billing/apikey/add/")
        page.select_option("#id_wallet", agent.wallet_id)
        page.fill("#id_name", "bot key")
        page.click("input[name=_save]")
        page.wait_for_selector("#api-key-secret")
        secret = page.inner_text("#api-key-secret").strip()
        assert secret.startswith("tg_key_")
        screenshot(page, "console-key-secret")
        page.reload()
        page.wait_for_selector("#secret-gone")
        assert secret not in page.content()
        assert APIKey.objects.filter(wallet=agent).count() == 1
        # 7. Closing asks first, listing the balance that goes back, then closes.
        page.goto(f"{live_server.url}/admin/billing/wallet/")
        page.check(f"input.action-select[value='{agent.wallet_id}']")
        page.select_option("select[name=action]", "close_wallets")
        page.click("button[name=index]")
        page.wait_for_selector("#confirm-objects")
        assert "100" in page.inner_text("#confirm-objects")
        assert Wallet.objects.get(pk=agent.wallet_id).status == "active"
        screenshot(page, "console-close-confirmation")
        page.click("#confirm-action")
        page.wait_for_selector(".messagelist .success")
        assert "Closed 1 wallet(s)" in page.inner_text(".messagelist")
        assert Wallet.objects.get(pk=agent.wallet_id).status == "closed"
        # 12. The console's "View site" leads to the landing page.
        page.click("text=View site")
        page.wait_for_selector("#landing-links")
        assert "Operator console" in page.inner_text("#landing-links")


def test_permissions_throttling_prices_and_approvers_in_the_browser(
    live_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.contrib.auth.models import Permission

    from billing.models import ToolPrice
    from mcpgateway.services import tools_sync
    from permits.models import TenantApprover

    require_chromium()
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    get_user_model().objects.create_superuser("root", "", "pw-for-tests-only")
    viewer = get_user_model().objects.create_user("viewer", password="pw-viewer-only", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(content_type__app_label="billing", codename="view_wallet"))
    get_user_model().objects.create_user("alice", password="pw-alice-approver")
    tenant = make_tenant("flows")
    tools_sync(remote_tools=[{"name": "notes.append", "description": "Append a note.", "inputSchema": {}}])

    with browser_page(viewport=VIEWPORT) as page:
        # 1. A staff user who may only view wallets is not offered money-moving actions.
        page.goto(f"{live_server.url}/admin/login/?next=/admin/billing/wallet/")
        page.fill("#id_username", "viewer")
        page.fill("#id_password", "pw-viewer-only")
        page.click("input[type=submit]")
        page.wait_for_selector("#result_list")
        options = page.eval_on_selector_all("select[name=action] option", "els => els.map(e => e.value)")
        assert "provision_credits" not in options
        assert "close_wallets" not in options
        screenshot(page, "console-view-only-wallets")
        page.goto(f"{live_server.url}/admin/receipts/receipt/")
        assert page.query_selector("#forbidden") is not None  # a page for a person, not JSON

    with browser_page(viewport=VIEWPORT) as page:
        # 2. Guessing passwords is stopped with a clear page: twelve failures of one account from one
        # client lock it there (access.login_throttle, no window boundary however slowly the browser types).
        for i in range(13):
            page.goto(f"{live_server.url}/admin/login/")
            page.fill("#id_username", "root")
            page.fill("#id_password", f"wrong-{i}")
            page.click("input[type=submit]")
            wait_for(page, "#id_username, #locked")
        wait_for(page, "#locked")
        assert "Retry in" in page.inner_text("#locked")
        screenshot(page, "console-login-locked")

    # The lock holds root from this client for a minute: the throttle's clock moves past it.
    later = login_throttle.clock() + timedelta(seconds=61)
    monkeypatch.setattr(login_throttle, "clock", lambda: later)
    with browser_page(viewport=VIEWPORT) as page:
        _login(page, live_server.url, "/admin/billing/toolprice/add/")
        # 8. Prices are set on synced tools only, and can be removed.
        page.wait_for_selector("#id_tool")
        choices = page.eval_on_selector_all("#id_tool option", "els => els.map(e => e.value)")
        assert choices == ["", "notes.append"]
        page.select_option("#id_tool", "notes.append")
        page.fill("#id_credits", "0.5")
        page.click("input[name=_save]")
        page.wait_for_selector(".messagelist .success")
        assert ToolPrice.objects.get(tool="notes.append").credits == 0.5
        page.goto(f"{live_server.url}/admin/billing/toolprice/notes.append/delete/")
        page.click("input[type=submit]")
        page.wait_for_selector(".messagelist .success")
        assert not ToolPrice.objects.filter(tool="notes.append").exists()
        # 10. Making a user an approver of a tenant.
        page.goto(f"{live_server.url}/admin/permits/tenantapprover/add/")
        page.select_option("#id_user", label="alice")
        page.select_option("#id_tenant", tenant.sponsor.wallet_id)
        page.click("input[name=_save]")
        page.wait_for_selector(".messagelist .success")
        assert TenantApprover.objects.filter(user__username="alice", tenant=tenant.sponsor).exists()
        screenshot(page, "console-approver-added")
