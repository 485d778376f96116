"""Day two in the console (issue 30), in Chromium at 1366x768: each list's key columns are on screen,
money and time read one way, read-only pages say "View", action pages have breadcrumbs, the approval
card tells the approver about the tenant, the wallet and the policy, the console warns when
approvers cannot be reached."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.utils import timezone

from common.ids import new_id
from mcpgateway.models import Action, UpstreamProbeSource
from mcpgateway.services.upstreams import upstream_server_create, upstream_server_state_record
from tests.browser import browser_page, require_chromium, screenshot, wait_for
from tests.conftest import make_tenant
from tests.test_permit_requests import ask
from tests.test_receipts import make_receipt

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
VIEWPORT = {"width": 1366, "height": 768}
PASSWORD = "pw-for-tests-only"

# Each list and the columns an operator needs on it (the CSS class Django gives each column header).
KEY_COLUMNS = {
    "/admin/receipts/receipt/": ["receipt_short", "created_at", "wallet_short", "tool", "outcome", "credits_col"],
    "/admin/permits/permit/": ["permit_short", "wallet_short", "status", "allowance", "spent_col", "expires_at"],
    "/admin/audit/auditevent/": ["event_short", "created_at", "event", "ok", "wallet_short"],
    "/admin/billing/ledgerentry/": [
        "created_at",
        "account_short",
        "kind",
        "amount_col",
        "balance_after_col",
        "description",
    ],
    "/admin/billing/wallet/": ["wallet_short", "wallet_type", "name", "status", "balance_col", "created_at"],
    "/admin/access/apikey/": ["key_short", "wallet_short", "name", "status", "created_at"],
    "/admin/mcpgateway/action/": [
        "action_short",
        "created_at",
        "wallet_short",
        "tool",
        "state",
        "outcome",
        "price_col",
    ],
    "/admin/permits/permitrequest/": ["request_short", "wallet_short", "status", "allowance", "created_at"],
    "/admin/mcpgateway/upstreamserver/": ["slug", "name", "server_state"],
}


def login(page: Any, url: str, path: str = "/admin/") -> None:
    page.goto(f"{url}/admin/login/?next={path}")
    page.fill("#id_username", "root")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_load_state()


def offscreen_columns(page: Any, columns: list[str]) -> list[str]:
    """The columns whose header is missing, hidden, or not wholly inside the viewport and the list's own
    scrolling box (scrolled away)."""
    return page.evaluate(
        """([columns, width]) => columns.filter((name) => {
            const th = document.querySelector(`#result_list th.column-${name}`);
            if (!th) return true;
            const box = th.getBoundingClientRect();
            const shown = th.closest(".results").getBoundingClientRect();
            return box.width === 0 || box.left < Math.max(0, shown.left) || box.right > Math.min(width, shown.right);
        })""",
        [columns, VIEWPORT["width"]],
    )


def test_each_list_shows_its_key_columns_at_1366(live_server: Any) -> None:
    require_chromium()
    get_user_model().objects.create_superuser("root", "", PASSWORD)
    tenant = make_tenant("a tenant with a fairly long name for the list")
    uncertain = make_receipt(tenant, outcome="delivery_uncertain")
    Action.objects.create(
        action_id=uncertain.action_id, tenant_id=tenant.agent.tenant_id, wallet=tenant.agent, api_key_id="",
        idempotency_key=new_id("k"), request_hash="0" * 64, tool=uncertain.tool, transport="mcp",
        state="delivery_uncertain", outcome="delivery_uncertain", receipt=uncertain, created_at=timezone.now(),
        claimed_at=timezone.now(), completed_at=timezone.now(),
    )  # fmt: skip
    assert ask(tenant.agent_client, tenant.agent.wallet_id).status_code == 202
    server = upstream_server_create(
        slug="payments", name="Payments", url="https://payments.internal.example/mcp", tool_prefix="pay", actor="t"
    )
    probe = {"reachable": True, "protocol_version": "2025-11-25", "error": None}
    upstream_server_state_record(server_id=server.server_id, probe=probe, checked_by=UpstreamProbeSource.READINESS)
    with browser_page(viewport=VIEWPORT) as page:
        login(page, live_server.url)
        problems = {}
        for path, columns in KEY_COLUMNS.items():
            page.goto(f"{live_server.url}{path}")
            wait_for(page, "#result_list")
            missing = offscreen_columns(page, columns)
            screenshot(page, "day-two-list" + path.replace("/", "-").rstrip("-"))
            if missing:
                problems[path] = missing
            assert page.evaluate("document.scrollingElement.scrollWidth") <= VIEWPORT["width"], path
        assert problems == {}, problems


def test_the_filter_sidebar_collapses_and_stays_collapsed(live_server: Any) -> None:
    require_chromium()
    get_user_model().objects.create_superuser("root", "", PASSWORD)
    tenant = make_tenant("filters")
    make_receipt(tenant)
    with browser_page(viewport=VIEWPORT) as page:
        login(page, live_server.url, "/admin/receipts/receipt/")
        wait_for(page, "#result_list")
        assert page.is_visible("#changelist-filter")
        wide_before = page.evaluate("document.querySelector('#result_list').getBoundingClientRect().width")
        wait_for(page, "#toggle-filters").click()
        assert not page.is_visible("#changelist-filter")
        assert page.evaluate("document.querySelector('#result_list').getBoundingClientRect().width") > wide_before
        page.goto(f"{live_server.url}/admin/billing/ledgerentry/")  # the choice holds on every list
        wait_for(page, "#result_list")
        assert not page.is_visible("#changelist-filter")
        assert page.inner_text("#toggle-filters") == "Show filters"
        page.click("#toggle-filters")
        assert page.is_visible("#changelist-filter")


def test_the_card_shows_tenant_frozen_wallet_and_policy_caps_and_the_console_links_to_it(
    live_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from decimal import Decimal

    from billing.services import wallet_freeze
    from permits.services import policy_create

    require_chromium()
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    get_user_model().objects.create_superuser("root", "", PASSWORD)
    tenant = make_tenant("Northwind")
    policy_create(
        wallet=tenant.sponsor,
        actor="test",
        name="spend gate",
        human_approval_required=True,
        max_credits_per_call=Decimal("2.5"),
        max_daily_credits=Decimal("1000"),
    )
    r = ask(tenant.agent_client, tenant.agent.wallet_id, key="card")
    assert r.status_code == 202, r.content
    request_id = r.json()["request_id"]
    wallet_freeze(wallet=tenant.agent, reason="investigation", actor="test")
    with browser_page(viewport=VIEWPORT) as page:
        login(page, live_server.url, f"/admin/permits/permitrequest/{quote(request_id)}/change/")
        wait_for(page, "#permit-request-card-link").click()
        card = wait_for(page, ".permit-request-card").inner_text()
        screenshot(page, "day-two-card-frozen")
        assert "Northwind" in page.inner_text("[data-field=tenant]")
        assert tenant.sponsor.wallet_id in page.inner_text("[data-field=tenant]")
        assert "The wallet is frozen." in page.inner_text("[data-field=wallet-state]")
        caps = page.inner_text("[data-field=policy-caps]")
        assert "spend gate" in caps
        assert "at most 2.50 credits a call" in caps
        assert "at most 1,000.00 credits a day" in caps
        assert "Why a person must approve" in card


def test_the_console_warns_when_approvers_cannot_be_reached_and_sets_a_webhook(
    live_server: Any, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    from audit.models import AuditEvent
    from permits.models import TenantNotification

    require_chromium()
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    settings.EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"  # make run's default
    get_user_model().objects.create_superuser("root", "", PASSWORD)
    approver = get_user_model().objects.create_user("dana", password="pw-dana-12345")  # no email address
    tenant = make_tenant("Contoso")
    assert ask(tenant.agent_client, tenant.agent.wallet_id, key="warn").status_code == 202
    with browser_page(viewport=VIEWPORT) as page:
        login(page, live_server.url, "/admin/permits/tenantapprover/add/")
        page.select_option("#id_user", str(approver.pk))
        page.select_option("#id_tenant", tenant.sponsor.wallet_id)
        page.click("input[name=_save]")
        messages = wait_for(page, "ul.messagelist").inner_text()
        screenshot(page, "day-two-approver-added")
        assert f"Approver dana signs in at {settings.PUBLIC_BASE_URL}/approvals/" in messages
        assert "Approver dana will not be told of new requests by email (no email address)" in messages
        assert "console backend" in messages
        assert f"{settings.PUBLIC_BASE_URL}/approvals/" in page.inner_text("#result_list")  # each approver's address
        page.goto(f"{live_server.url}/admin/")
        assert tenant.sponsor.wallet_id in wait_for(page, "#summary-unreachable").inner_text()
        assert "Contoso" in page.inner_text("#summary-pending-by-tenant")
        # The operator sets the tenant's webhook; the secret is never shown again.
        page.goto(f"{live_server.url}/admin/permits/tenantnotification/add/")
        page.select_option("#id_tenant", tenant.sponsor.wallet_id)
        page.fill("#id_webhook_url", "https://hooks.example/services/T0/B0")
        page.fill("#id_new_webhook_secret", "whsec-browser-only")
        page.click("input[name=_save]")
        wait_for(page, "ul.messagelist")
        notification = TenantNotification.objects.get(tenant=tenant.sponsor)
        page.goto(f"{live_server.url}/admin/permits/tenantnotification/{quote(notification.pk)}/change/")
        wait_for(page, "#id_new_webhook_secret")
        assert page.input_value("#id_new_webhook_secret") == ""
        assert "whsec-browser-only" not in page.content()
        assert "never shown again" in page.inner_text(".field-secret_state")
        assert "reachable" in page.inner_text(".field-reachability")
        page.goto(f"{live_server.url}/admin/")
        wait_for(page, "#console-summary")
        assert page.query_selector("#summary-unreachable") is None
    assert notification.webhook_secret == "whsec-browser-only"
    changed = AuditEvent.objects.get(event="approver_notification.changed")
    assert changed.detail["webhook_secret_changed"] is True
    assert changed.detail["actor"] == "admin:root"
    assert "whsec-browser-only" not in str(changed.detail)


def test_the_policy_form_offers_choices_not_json(live_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from billing.services import wallet_close
    from mcpgateway.models import Tool
    from permits.models import PolicyBundle
    from tests import factories

    require_chromium()
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    get_user_model().objects.create_superuser("root", "", PASSWORD)
    for name in ("notes.append", "notes.list", "math.add"):
        Tool.objects.create(service_id=name)
    tenant = make_tenant("Fabrikam")
    closed = factories.make_wallet(tenant.sponsor, "retired")
    wallet_close(wallet=closed, actor="test")
    with browser_page(viewport=VIEWPORT) as page:
        login(page, live_server.url, "/admin/permits/policybundle/add/")
        wait_for(page, "#id_wallet")
        wallets = page.eval_on_selector_all("#id_wallet option", "options => options.map(o => o.value)")
        assert tenant.agent.wallet_id in wallets
        assert closed.wallet_id not in wallets  # a closed wallet is no target
        tools = page.eval_on_selector_all("#id_allowed_tools option", "options => options.map(o => o.value)")
        assert {"notes.append", "notes.list", "math.add", "notes.*", "math.*"} == set(tools)
        categories = page.eval_on_selector_all("input[name=allowed_categories]", "boxes => boxes.map(b => b.type)")
        assert categories
        assert set(categories) == {"checkbox"}
        for limit in ("#id_max_credits_per_call", "#id_max_daily_credits"):
            assert page.get_attribute(limit, "type") == "number"
            assert page.input_value(limit) == ""
        assert "Empty: no limit per call" in page.inner_text(".field-max_credits_per_call")
        values = page.eval_on_selector_all("input, textarea", "els => els.map(e => e.value)")
        assert "null" not in values
        assert "[]" not in values
        screenshot(page, "day-two-policy-form")
        page.select_option("#id_wallet", tenant.agent.wallet_id)
        page.fill("#id_name", "notes only")
        page.check("#id_tools_mode_1")
        page.select_option("#id_allowed_tools", ["notes.append", "notes.list"])
        page.check("#id_categories_mode_1")
        page.check("input[name=allowed_categories][value=tooling]")
        page.fill("#id_max_credits_per_call", "2.5")
        page.click("input[name=_save]")
        wait_for(page, "ul.messagelist")
    policy = PolicyBundle.objects.get(name="notes only")
    assert policy.wallet_id == tenant.agent.wallet_id
    assert (policy.allowed_tools, policy.denied_tools, policy.allowed_categories) == (
        ["notes.append", "notes.list"],
        [],
        ["tooling"],
    )
    assert str(policy.max_credits_per_call) == "2.50000000"
    assert policy.max_daily_credits is None
