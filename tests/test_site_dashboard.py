"""/dashboard: aggregate status for everyone; chain heads, signing key and evidence index for staff only."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from audit.models import ChainHead, SigningKey, SigningKeyState
from receipts.models import Receipt
from tests.test_receipts import make_receipt

pytestmark = pytest.mark.django_db


@pytest.fixture
def receipts(tenant) -> list[Receipt]:
    made = [
        make_receipt(tenant),
        make_receipt(tenant),
        make_receipt(tenant, outcome="delivery_uncertain"),
        make_receipt(tenant, outcome="failed_refunded", charged=False),
    ]
    # One receipt older than the 24-hour window.
    Receipt.objects.filter(pk=made[1].pk).update(created_at=timezone.now() - timedelta(hours=25))
    return made


def tile(html: str, outcome: str) -> int:
    match = re.search(rf'data-outcome="{outcome}">.*?class="value[^"]*">(\d+)<', html, re.S)
    assert match, outcome
    return int(match.group(1))


def test_anonymous_sees_aggregates_only(receipts, tenant):
    r = Client().get("/dashboard")
    assert r.status_code == 200
    html = r.content.decode()
    assert 'id="version">1.3.0<' in html
    assert 'id="overall-status"' in html
    assert tile(html, "success") == 1  # the other is 25 hours old, outside the window
    assert tile(html, "delivery_uncertain") == 1
    assert tile(html, "failed_refunded") == 1
    assert tile(html, "denied") == 0
    assert 'id="outcome-total">(3)<' in html
    assert 'id="aggregate-only"' in html
    assert 'id="evidence-index"' not in html
    assert 'id="chain-heads"' not in html
    for secret in (
        tenant.agent.wallet_id,
        tenant.sponsor.wallet_id,
        tenant.sponsor.tenant_id,
        *[x.receipt_id for x in receipts],
    ):
        assert secret not in html
    for head in ChainHead.objects.all():
        assert f"<code>{head.chain}</code>" not in html
    assert r["Cache-Control"] == "no-cache"


def test_logged_in_non_staff_sees_aggregates_only(receipts, tenant):
    user = get_user_model().objects.create_user(username="viewer", password="pw-viewer-123")
    client = Client()
    client.force_login(user)
    html = client.get("/dashboard").content.decode()
    assert 'id="aggregate-only"' in html
    assert receipts[0].receipt_id not in html
    assert tenant.agent.wallet_id not in html


def test_staff_sees_the_evidence_index(receipts, tenant):
    from django.contrib.auth.models import Permission

    staff = get_user_model().objects.create_user(username="ops", password="pw-ops-12345", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_receipt"))
    client = Client()
    client.force_login(staff)
    r = client.get("/dashboard")
    html = r.content.decode()
    assert 'id="evidence-index"' in html
    for receipt in receipts:
        assert receipt.receipt_id in html
        assert f'href="/dashboard/evidence/{receipt.receipt_id}"' in html
        assert f'href="/dashboard/portable/{receipt.receipt_id}"' in html
        evidence = client.get(f"/dashboard/evidence/{receipt.receipt_id}")
        assert evidence.status_code == 200
        assert evidence.json()["receipt"]["receipt_id"] == receipt.receipt_id
        assert client.get(f"/dashboard/portable/{receipt.receipt_id}").json()["receipt_id"] == receipt.receipt_id
    assert tenant.agent.wallet_id in html
    assert '<span class="badge warn">delivery_uncertain</span>' in html
    active = SigningKey.objects.get(state=SigningKeyState.ACTIVE)
    assert f'id="signing-key-id">{active.key_id}<' in html
    head = ChainHead.objects.get(chain=tenant.sponsor.tenant_id)
    assert f"<code>{head.chain}</code>" in html
    assert head.head_hash[:12] in html
    assert head.head_hash not in html.replace(f'title="{head.head_hash}"', "")
    assert r["Cache-Control"] == "no-store"


def test_dashboard_is_linked_in_the_nav():
    html = Client().get("/dashboard").content.decode()
    assert '<span class="brand">Tollgate</span>\n    <a href="/dashboard">Dashboard</a>' in html


def test_evidence_links_need_a_staff_session_with_the_permission(receipts):
    receipt_id = receipts[0].receipt_id
    anonymous = Client().get(f"/dashboard/evidence/{receipt_id}")
    assert anonymous.status_code == 302
    assert anonymous["Location"].startswith("/admin/login/?next=/dashboard/evidence/")  # the console's login
    staff = get_user_model().objects.create_user(username="clerk", password="pw-clerk-12345", is_staff=True)
    client = Client()
    client.force_login(staff)
    for path in (f"/dashboard/evidence/{receipt_id}", f"/dashboard/portable/{receipt_id}"):
        r = client.get(path)
        assert r.status_code == 404
        assert receipt_id not in r.content.decode().replace(f'"receipt_id": "{receipt_id}"', "").replace(
            f'"receipt_id":"{receipt_id}"', ""
        )
    assert 'id="evidence-index"' not in client.get("/dashboard").content.decode()


def test_root_is_a_landing_page_for_browsers_and_json_for_clients():
    page = Client().get("/", HTTP_ACCEPT="text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8")
    assert page.status_code == 200
    assert page["Content-Type"].startswith("text/html")
    html = page.content.decode()
    for href in ("/dashboard", "/docs", "/approvals/", "/admin/"):
        assert f'href="{href}"' in html
    api = Client().get("/", HTTP_ACCEPT="application/json")
    assert api.json()["name"] == "Tollgate"
    assert api.json()["links"]["operator_console"] == "/admin/"
    assert Client().get("/").json()["version"] == "1.3.0"
