"""A human approves a permit request in a real browser; the agent's poll returns the permit."""

from __future__ import annotations

from urllib.parse import urlparse

import pytest
from django.contrib.auth import get_user_model

from permits.models import Permit, TenantApprover
from tests.browser import browser_page, require_chromium, screenshot
from tests.conftest import make_tenant

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_human_approval_in_chromium(live_server):
    require_chromium()
    tenant = make_tenant("browser")
    user = get_user_model().objects.create_user(username="approver", password="pw-correct-horse")
    TenantApprover.objects.create(user=user, tenant=tenant.sponsor)
    r = tenant.agent_client.post(
        "/v1/permit-requests",
        {
            "wallet_id": tenant.agent.wallet_id,
            "allowed_tools": ["demo.echo"],
            "max_credits": "3",
            "justification": "weekly sync",
        },
        format="json",
        HTTP_IDEMPOTENCY_KEY="browser-1",
    )
    assert r.status_code == 202
    request_id = r.json()["request_id"]

    with browser_page() as page:
        page.goto(f"{live_server.url}/approvals/")
        assert "/approvals/login" in page.url
        page.fill("#id_username", "approver")
        page.fill("#id_password", "pw-correct-horse")
        page.click("#login")
        page.wait_for_selector("#pending")
        assert request_id in page.content()
        screenshot(page, "approvals-queue")
        page.click(f"a[href='/approvals/{request_id}']")
        page.wait_for_selector("#approve")
        screenshot(page, "approvals-detail")
        page.click("#approve")
        page.wait_for_selector("#minted-permit")
        minted = page.inner_text("#minted-permit")
        assert page.inner_text("#request-status") == "approved"
        screenshot(page, "approvals-approved")
        hosts = {urlparse(u).hostname for u in page.requested}
        assert hosts <= {"localhost", "127.0.0.1"}, hosts

    polled = tenant.agent_client.get(f"/v1/permit-requests/{request_id}").json()
    assert polled["status"] == "approved"
    assert polled["permit"]["permit_id"] == minted
    assert Permit.objects.filter(wallet=tenant.agent).count() == 1

    # The hosted card renders read-only: no approve button, no form.
    with browser_page(extra_http_headers={"X-API-Key": tenant.agent_secret}) as page:
        page.goto(f"{live_server.url}/v1/permit-requests/{request_id}/card")
        page.wait_for_selector(".permit-request-card")
        assert page.query_selector("button") is None
        assert page.query_selector("form") is None
        assert request_id in page.inner_text(".permit-request-card")
        screenshot(page, "permit-request-card")


def test_the_card_speaks_to_a_non_technical_approver(live_server):
    """Durations in words, the request's expiry apart from the permit's lifetime, tools with description and
    price, the wallet's balance and spend, and the decision with its note (no "decide" link once decided)."""
    from decimal import Decimal

    from billing.services import tool_price_set
    from mcpgateway.services import tools_sync
    from tests import factories

    require_chromium()
    tenant = make_tenant("words")
    factories.top_up(tenant.agent, 40)
    tools_sync(remote_tools=[{"name": "notes.append", "description": "Append a note to the notebook.",
                              "inputSchema": {"type": "object"}}])  # fmt: skip
    tool_price_set(tool="notes.append", credits=Decimal("1250.5"))
    user = get_user_model().objects.create_user(username="ann", password="pw-correct-horse")
    TenantApprover.objects.create(user=user, tenant=tenant.sponsor)
    r = tenant.agent_client.post(
        "/v1/permit-requests",
        {"wallet_id": tenant.agent.wallet_id, "allowed_tools": ["notes.append"], "max_credits": "2500",
         "expires_in_seconds": 7200, "justification": "write the weekly report", "allowed_servers": ["notes"]},
        format="json",
        HTTP_IDEMPOTENCY_KEY="words-1",
    )  # fmt: skip
    assert r.status_code == 202, r.content
    request_id = r.json()["request_id"]

    with browser_page(viewport={"width": 1366, "height": 768}) as page:
        page.goto(f"{live_server.url}/approvals/login?next=/approvals/{request_id}")
        page.fill("#id_username", "ann")
        page.fill("#id_password", "pw-correct-horse")
        page.click("#login")
        page.wait_for_selector("#approve")
        card = page.inner_text(".permit-request-card")
        assert "2 hours from the approval" in card  # the permit's lifetime, in words
        assert "This request expires in 23 hours" in card or "This request expires in 1 day" in card
        assert "Append a note to the notebook." in card
        assert "1,250.50 credits" in card  # common.formatting: at least two decimals
        assert "up to 2,500.00 credits" in card
        assert "40.00 credits; spent today 0.00" in card
        assert page.inner_text("[data-field=servers]") == "only notes"  # the upstream servers asked for
        assert "Decide on the approval page" not in card  # the form is right here
        screenshot(page, "approval-card-pending")
        page.fill("#note", "Fine for this week only.")
        page.click("#approve")
        page.wait_for_selector("#minted-permit")
        card = page.inner_text(".permit-request-card")
        assert "Approved by ann" in card
        assert "Note from the approver: “Fine for this week only.”" in card
        screenshot(page, "approval-card-decided")
    assert Permit.objects.get(issued_via_request_id=request_id).allowed_servers == ["notes"]

    with browser_page(extra_http_headers={"X-API-Key": tenant.agent_secret}) as page:
        page.goto(f"{live_server.url}/v1/permit-requests/{request_id}/card")
        page.wait_for_selector(".permit-request-card")
        text = page.inner_text(".permit-request-card")
        assert "Approved by ann" in text
        assert "Decide on the approval page" not in text  # decided: no link to decide
