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
