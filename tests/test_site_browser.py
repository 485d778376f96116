"""Human pages in headless Chromium: the dashboard (anonymous and staff), Swagger UI and ReDoc.

Every request a page makes must stay on loopback: the pages use local assets only.
"""

from __future__ import annotations

import json
from urllib.parse import urlparse

import pytest
from django.contrib.auth import get_user_model

from audit.services import signing_key_ensure
from tests.browser import browser_page, require_chromium, screenshot
from tests.conftest import make_tenant
from tests.test_receipts import make_receipt

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LOOPBACK = {"127.0.0.1", "localhost"}


def assert_loopback_only(page) -> None:
    hosts = {urlparse(u).hostname for u in page.requested if not u.startswith(("data:", "blob:"))}
    assert hosts <= LOOPBACK, hosts


def test_dashboard_anonymous_and_staff(live_server):
    require_chromium()
    signing_key_ensure()
    tenant = make_tenant("dash")
    receipt = make_receipt(tenant)
    make_receipt(tenant, outcome="delivery_uncertain")
    from django.contrib.auth.models import Permission

    ops = get_user_model().objects.create_user(username="ops", password="pw-ops-correct-horse", is_staff=True)
    # A permission, not the group: transactional tests flush the groups a data migration created.
    ops.user_permissions.add(Permission.objects.get(content_type__app_label="receipts", codename="view_receipt"))

    with browser_page() as page:
        page.goto(f"{live_server.url}/dashboard")
        page.wait_for_selector("#overall-status")
        assert page.inner_text("#version") == "1.3.0"
        assert page.inner_text('[data-outcome="success"] .value') == "1"
        assert page.inner_text('[data-outcome="delivery_uncertain"] .value') == "1"
        assert page.query_selector("#aggregate-only") is not None
        assert page.query_selector("#evidence-index") is None
        content = page.content()
        assert receipt.receipt_id not in content
        assert tenant.agent.wallet_id not in content
        screenshot(page, "dashboard-anonymous")
        assert_loopback_only(page)

        page.click("#aggregate-only a")
        page.fill("#id_username", "ops")
        page.fill("#id_password", "pw-ops-correct-horse")
        page.click("#login")
        page.wait_for_selector("#evidence-index")
        assert urlparse(page.url).path == "/dashboard"
        index = page.inner_text("#evidence-index")
        assert receipt.receipt_id in index
        assert "delivery_uncertain" in index
        # The evidence links work with the console session (no API key in a browser).
        page.click(f'a[href="/dashboard/evidence/{receipt.receipt_id}"]')
        page.wait_for_load_state("load")
        bundle = json.loads(page.inner_text("body"))
        assert bundle["receipt"]["receipt_id"] == receipt.receipt_id
        assert bundle["verification"]["receipt_signature"] == "ok"
        screenshot(page, "dashboard-evidence-with-session")
        page.go_back()
        page.click(f'a[href="/dashboard/portable/{receipt.receipt_id}"]')
        page.wait_for_load_state("load")
        assert json.loads(page.inner_text("body"))["receipt_id"] == receipt.receipt_id
        page.go_back()
        page.wait_for_selector("#evidence-index")
        assert page.inner_text("#signing-key-id").startswith("sig_")
        assert page.query_selector("#chain-heads") is not None
        screenshot(page, "dashboard-staff")
        assert_loopback_only(page)


@pytest.mark.parametrize(
    ("page_path", "title_selector", "artifact"),
    [
        ("/docs", ".swagger-ui .info .title", "docs-swagger-ui"),
        ("/redoc", ".api-info h1", "docs-redoc"),
    ],
)
def test_api_docs_render_with_local_assets(live_server, page_path, title_selector, artifact):
    require_chromium()
    with browser_page() as page:
        page.goto(f"{live_server.url}{page_path}")
        title = page.wait_for_selector(title_selector, timeout=30_000)
        page.wait_for_function(
            "sel => (document.querySelector(sel) || {}).textContent?.includes('Tollgate')",
            arg=title_selector,
            timeout=30_000,
        )
        assert "Tollgate" in title.inner_text()
        assert "1.3.0" in page.content()
        page.wait_for_load_state("networkidle")
        screenshot(page, artifact)
        assert_loopback_only(page)
        assert any(urlparse(u).path == "/openapi.json" for u in page.requested)
