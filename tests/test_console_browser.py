"""The console in Chromium at 1366x768: lists readable without horizontal scrolling, links between related
objects, the index summary, and the first job of a new operator (a sponsor and an agent wallet, a key)."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
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
        assert tenant.agent.wallet_id in page.inner_html("#result_list")  # shortened ids carry the full id on hover
        page.go_back()
        wait_for(page, ".field-related a:text-is('receipts')").click()
        page.wait_for_selector("#result_list")
        assert receipt.receipt_id in page.inner_html("#result_list")
        # A receipt links to its action, ledger entry and audit event.
        page.goto(f"{live_server.url}/admin/receipts/receipt/{quote(receipt.receipt_id)}/change/")
        wait_for(page, ".field-related a:text-is('audit event')").click()
        page.wait_for_selector("#result_list")
        assert receipt.audit_event_id in page.inner_html("#result_list")


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


def _run_action(page: Any, url: str, selected: str, action: str) -> None:
    page.goto(url)
    page.check(f"input.action-select[value='{selected}']")
    page.select_option("select[name=action]", action)
    page.click("button[name=index]")


def test_day_two_in_the_console(live_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 30: settings, a price change, a rotation, a revocation with its reason, audit search, chain
    verification and a receipt's downloads, each done in the browser, each in the object's History."""
    from audit.models import ChainVerificationRecord
    from billing.models import ToolPrice, ToolPriceChange
    from billing.services import tool_price_set, wallet_freeze
    from mcpgateway.services import tools_sync
    from permits.models import Permit

    require_chromium()
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    get_user_model().objects.create_superuser("root", "", "pw-for-tests-only")
    tenant = make_tenant("daytwo")
    receipt = make_receipt(tenant)  # the agent spent 2 credits today
    tools_sync(remote_tools=[{"name": "notes.append", "description": "Append a note.", "inputSchema": {}}])
    tool_price_set(tool="notes.append", credits=Decimal("0.5"), actor="manage.py set_tool_price")
    agent_id = tenant.agent.wallet_id

    with browser_page(viewport=VIEWPORT, accept_downloads=True) as page:
        # 1. The wallet's settings: a daily limit under today's spend is kept, and the page says so.
        _login(page, live_server.url, f"/admin/billing/wallet/{quote(agent_id)}/change/")
        wait_for(page, "#change-wallet-settings").click()
        wait_for(page, "#wallet-settings")
        page.fill("#id_name", "night shift")
        page.fill("#id_daily_limit", "1")
        page.fill("#id_budget", "300")
        screenshot(page, "console-wallet-settings")
        page.click("#save-settings")
        wait_for(page, ".messagelist .success")
        assert "already spent today" in page.inner_text(".messagelist .warning")
        agent = Wallet.objects.get(pk=agent_id)
        assert (agent.name, agent.daily_limit, agent.budget) == ("night shift", 1, 300)
        page.goto(f"{live_server.url}/admin/billing/wallet/{quote(agent_id)}/history/")
        wait_for(page, "#settings-history")
        assert "admin:root" in page.inner_text("#settings-history")
        assert "Changed settings" in page.inner_text("#change-history")

        # 2. A price changes from the tool's page, in place, with its history.
        page.goto(f"{live_server.url}/admin/mcpgateway/tool/{quote('notes.append')}/change/")
        wait_for(page, "#tool-price-link").click()
        wait_for(page, "#id_credits")
        page.fill("#id_credits", "0.75")
        page.click("input[name=_save]")
        wait_for(page, ".messagelist .success")
        assert ToolPrice.objects.get(tool="notes.append").credits == Decimal("0.75")
        page.goto(f"{live_server.url}/admin/billing/toolprice/{quote('notes.append')}/change/")
        history = wait_for(page, ".price-history").inner_text()
        assert "admin:root" in history
        assert "0.75" in history
        assert "manage.py set_tool_price" in history
        assert ToolPriceChange.objects.filter(tool="notes.append", removed=True).count() == 0

        # 3. A key is rotated: the reason asked for, the successor's secret shown once.
        _run_action(page, f"{live_server.url}/admin/billing/apikey/", tenant.agent_key_id, "rotate_selected")
        wait_for(page, "#confirm-form")
        assert page.get_attribute("#id_reason", "required") is not None  # the browser asks for it first
        page.fill("#id_reason", "laptop lost")
        page.click("#confirm-action")
        secret = wait_for(page, "#api-key-secret").inner_text().strip()
        assert "Successor of" in page.inner_text("#rotated-from")
        screenshot(page, "console-key-rotated")
        page.reload()
        wait_for(page, "#secret-gone")
        assert secret not in page.content()
        assert APIKey.objects.get(pk=tenant.agent_key_id).revoke_reason == "laptop lost"

        # 4. A permit is revoked with a reason, stored and audited.
        permit_id = receipt.permit_id
        _run_action(page, f"{live_server.url}/admin/permits/permit/", permit_id, "revoke_selected")
        wait_for(page, "#confirm-form")
        page.fill("#id_reason", "task cancelled")
        page.click("#confirm-action")
        wait_for(page, ".messagelist .success")
        assert Permit.objects.get(pk=permit_id).revoke_reason == "task cancelled"

        # 5. Audit search by actor, event name and object id.
        wallet_freeze(wallet=Wallet.objects.get(pk=agent_id), reason="drill", actor="admin:operator")
        for term, expected in (("admin:operator", "wallet.frozen"), ("wallet.frozen", "wallet.frozen"),
                               (permit_id, "permit.revoked"), ("admin:root", "wallet.settings_changed")):  # fmt: skip
            page.goto(f"{live_server.url}/admin/audit/auditevent/")
            page.fill("#searchbar", term)
            page.press("#searchbar", "Enter")
            wait_for(page, "#result_list")
            assert expected in page.inner_text("#result_list"), term
        screenshot(page, "console-audit-search")

        # 6. The tenant's chain verified from the console: verdict and checkpoint shown, verdict recorded.
        _run_action(page, f"{live_server.url}/admin/audit/chainhead/", tenant.sponsor.wallet_id, "verify_selected")
        wait_for(page, "#chain-verification .chain-valid")
        assert tenant.sponsor.wallet_id in page.inner_text(".chain-checkpoint")
        assert ChainVerificationRecord.objects.get(chain=tenant.sponsor.wallet_id).valid
        screenshot(page, "console-chain-verified")

        # 7. The receipt's page offers the portable receipt and the evidence bundle as downloads.
        page.goto(f"{live_server.url}/admin/receipts/receipt/{quote(receipt.receipt_id)}/change/")
        for link in ("#download-portable", "#download-evidence"):
            with page.expect_download() as download:
                wait_for(page, link).click()
            body = json.loads(Path(download.value.path()).read_text())
            assert receipt.receipt_id in json.dumps(body)

        # 8. Recent actions on the index list the console's custom actions, not only "Added".
        page.goto(f"{live_server.url}/admin/")
        recent = wait_for(page, "#recent-actions-module").inner_text()
        assert permit_id in recent
        assert agent_id in recent
        screenshot(page, "console-recent-actions")
