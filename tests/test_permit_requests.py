"""Permit requests and the human approval surface."""

from __future__ import annotations

import re
import threading
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.db import connection
from django.test import Client
from django.utils import timezone

from audit.models import AuditEvent
from permits import services
from permits.models import Permit, PermitRequest, TenantApprover
from tests.conftest import make_tenant

pytestmark = pytest.mark.django_db

IDEM = "HTTP_IDEMPOTENCY_KEY"


def ask(client, wallet_id, key="r1", **extra):
    body = {
        "wallet_id": wallet_id,
        "allowed_tools": ["demo.echo"],
        "max_credits": "5",
        "justification": "nightly report",
        **extra,
    }
    return client.post("/v1/permit-requests", body, format="json", **{IDEM: key})


def approver_for(tenant, username="alice"):
    user = get_user_model().objects.create_user(
        username=username, password="pw-correct-horse", email=f"{username}@example.test"
    )
    TenantApprover.objects.create(user=user, tenant=tenant.sponsor)
    client = Client()
    assert client.login(username=username, password="pw-correct-horse")
    return user, client


def test_request_is_accepted_pending_with_poll_url(tenant):
    r = ask(tenant.agent_client, tenant.agent.wallet_id)
    assert r.status_code == 202, r.content
    body = r.json()
    assert body["status"] == "pending"
    assert body["request_id"].startswith("preq_")
    assert body["poll_url"] == f"/v1/permit-requests/{body['request_id']}"
    assert r["Location"] == body["poll_url"]
    assert body["permit"] is None
    polled = tenant.agent_client.get(body["poll_url"])
    assert polled.status_code == 200
    assert polled.json()["status"] == "pending"
    assert AuditEvent.objects.filter(event="permit_request.created").count() == 1


def test_request_idempotency(tenant):
    first = ask(tenant.agent_client, tenant.agent.wallet_id, key="same").json()
    again = ask(tenant.agent_client, tenant.agent.wallet_id, key="same")
    assert again.status_code == 202
    assert again["Idempotent-Replayed"] == "true"
    assert again.json()["request_id"] == first["request_id"]
    conflict = ask(tenant.agent_client, tenant.agent.wallet_id, key="same", max_credits="6")
    assert conflict.status_code == 422
    assert conflict.json()["detail"][0]["type"] == "idempotency_key_reused"
    missing = tenant.agent_client.post("/v1/permit-requests", {"wallet_id": tenant.agent.wallet_id}, format="json")
    assert missing.status_code == 422
    assert PermitRequest.objects.count() == 1


def test_caller_must_hold_the_subject_wallet(tenant, other_tenant):
    assert ask(tenant.agent_client, tenant.sponsor.wallet_id).status_code == 403
    assert ask(tenant.agent_client, other_tenant.agent.wallet_id, key="x").status_code == 403
    preq = ask(tenant.agent_client, tenant.agent.wallet_id, key="y").json()
    assert other_tenant.agent_client.get(f"/v1/permit-requests/{preq['request_id']}").status_code == 404
    assert other_tenant.agent_client.get(f"/v1/permit-requests/{preq['request_id']}/card").status_code == 404


def test_notification_email_goes_to_the_tenants_approvers(tenant, other_tenant, django_capture_on_commit_callbacks):
    approver_for(tenant, "alice")
    approver_for(other_tenant, "mallory")
    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        r = ask(tenant.agent_client, tenant.agent.wallet_id, key="mail")
    preq_id = r.json()["request_id"]
    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["alice@example.test"]
    assert preq_id in message.subject
    assert f"/approvals/{preq_id}" in message.body
    html = message.alternatives[0][0]  # type: ignore[attr-defined]
    # The same card template as GET /v1/permit-requests/{id}/card.
    card = tenant.agent_client.get(f"/v1/permit-requests/{preq_id}/card").content.decode()
    assert html.strip() in card
    assert "<form" not in html


def approval(request_id: str) -> dict[str, str]:
    """The approval form's fields as the page sends them: the decision and the digest of the terms shown."""
    terms = services.permit_request_terms(PermitRequest.objects.get(pk=request_id))
    return {"decision": "approve", "terms": terms}


def test_an_approval_of_terms_changed_after_the_page_was_shown_mints_nothing(tenant):
    """The page sends back a digest of the terms it showed; someone who changes the request row between the
    page and the click (the allowance, the tools) gets no permit signed for terms the approver never saw."""
    preq = ask(tenant.agent_client, tenant.agent.wallet_id).json()
    _, browser = approver_for(tenant)
    page = browser.get(f"/approvals/{preq['request_id']}").content.decode()
    shown = re.search(r'name="terms" value="([0-9a-f]{64})"', page)
    assert shown is not None
    PermitRequest.objects.filter(pk=preq["request_id"]).update(max_credits=Decimal("5000"), allowed_tools=["*"])
    for terms in (shown[1], "", "0" * 64):
        r = browser.post(
            f"/approvals/{preq['request_id']}/decide", {"decision": "approve", "terms": terms}, follow=True
        )
        assert "terms changed after the page was shown" in r.content.decode()
    assert not Permit.objects.exists()
    assert PermitRequest.objects.get(pk=preq["request_id"]).status == "pending"
    # Reviewed again, the new terms are approved as shown.
    page = browser.get(f"/approvals/{preq['request_id']}").content.decode()
    assert "5,000" in page
    fresh = re.search(r'name="terms" value="([0-9a-f]{64})"', page)
    assert fresh is not None
    assert fresh[1] != shown[1]
    browser.post(f"/approvals/{preq['request_id']}/decide", {"decision": "approve", "terms": fresh[1]})
    assert Permit.objects.get().max_credits == Decimal("5000")


def test_card_is_read_only_html(tenant):
    preq = ask(tenant.agent_client, tenant.agent.wallet_id).json()
    r = tenant.agent_client.get(f"/v1/permit-requests/{preq['request_id']}/card")
    assert r.status_code == 200
    assert r["Content-Type"].startswith("text/html")
    html = r.content.decode()
    assert preq["request_id"] in html
    assert "demo.echo" in html
    assert "<form" not in html
    assert "<button" not in html
    assert tenant.agent_client.get("/v1/permit-requests/preq_nope/card").json()["detail"]["error"] == "not_found"


def test_human_approves_and_the_poll_returns_the_permit(tenant):
    preq = ask(tenant.agent_client, tenant.agent.wallet_id).json()
    _user, browser = approver_for(tenant)
    queue = browser.get("/approvals/")
    assert queue.status_code == 200
    assert preq["request_id"] in queue.content.decode()
    page = browser.get(f"/approvals/{preq['request_id']}")
    assert 'name="csrfmiddlewaretoken"' in page.content.decode()
    terms = re.search(r'name="terms" value="([0-9a-f]{64})"', page.content.decode())
    assert terms is not None
    r = browser.post(f"/approvals/{preq['request_id']}/decide", {"decision": "approve", "terms": terms[1]})
    assert r.status_code == 302
    polled = tenant.agent_client.get(f"/v1/permit-requests/{preq['request_id']}").json()
    assert polled["status"] == "approved"
    permit = polled["permit"]
    assert permit["wallet_id"] == tenant.agent.wallet_id
    assert permit["issuer_wallet_id"] == tenant.sponsor.wallet_id
    assert permit["allowed_tools"] == ["demo.echo"]
    assert permit["max_credits"] == "5.00000000"
    assert permit["issued_via_request_id"] == preq["request_id"]
    # Approving again (second click, second tab) mints nothing more.
    browser.post(f"/approvals/{preq['request_id']}/decide", {"decision": "approve", "terms": terms[1]})
    browser.post(f"/approvals/{preq['request_id']}/decide", {"decision": "reject"})
    assert Permit.objects.count() == 1
    assert PermitRequest.objects.get().status == "approved"
    assert AuditEvent.objects.filter(event="permit_request.approved").count() == 1


def test_reject(tenant):
    preq = ask(tenant.agent_client, tenant.agent.wallet_id).json()
    _, browser = approver_for(tenant)
    browser.post(f"/approvals/{preq['request_id']}/decide", {"decision": "reject", "note": "not now"})
    polled = tenant.agent_client.get(f"/v1/permit-requests/{preq['request_id']}").json()
    assert polled["status"] == "rejected"
    assert polled["permit"] is None
    assert polled["decision_note"] == "not now"


def test_expired_request_cannot_be_approved(tenant):
    preq = ask(tenant.agent_client, tenant.agent.wallet_id).json()
    PermitRequest.objects.filter(pk=preq["request_id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    _, browser = approver_for(tenant)
    r = browser.post(f"/approvals/{preq['request_id']}/decide", approval(preq["request_id"]), follow=True)
    assert "expired" in r.content.decode()
    assert not Permit.objects.exists()
    assert tenant.agent_client.get(f"/v1/permit-requests/{preq['request_id']}").json()["status"] == "expired"
    assert tenant.agent_client.get("/v1/me/permit-requests?status=expired").json()["total"] == 1


def test_non_approvers_and_api_keys_cannot_reach_the_pages(tenant, other_tenant):
    preq = ask(tenant.agent_client, tenant.agent.wallet_id).json()
    _, outsider = approver_for(other_tenant, "mallory")
    assert outsider.get(f"/approvals/{preq['request_id']}").status_code == 404
    assert outsider.post(f"/approvals/{preq['request_id']}/decide", {"decision": "approve"}).status_code == 404
    assert preq["request_id"] not in outsider.get("/approvals/").content.decode()
    # An API key is not a login.
    keyed = Client(HTTP_X_API_KEY=tenant.sponsor_secret)
    r = keyed.get("/approvals/")
    assert r.status_code == 302
    assert r["Location"].startswith("/approvals/login")
    r = keyed.post(f"/approvals/{preq['request_id']}/decide", {"decision": "approve"})
    assert r.status_code in (302, 403)
    # CSRF is enforced on the decision form.
    user, _ = approver_for(tenant, "bob")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    assert strict.post(f"/approvals/{preq['request_id']}/decide", {"decision": "approve"}).status_code == 403
    assert not Permit.objects.exists()


def test_listing_never_advances_a_decision(tenant):
    ask(tenant.agent_client, tenant.agent.wallet_id)
    _, browser = approver_for(tenant)
    for _ in range(3):
        tenant.agent_client.get("/v1/me/permit-requests")
        browser.get("/approvals/")
    assert PermitRequest.objects.get().status == "pending"
    body = tenant.agent_client.get("/v1/me/permit-requests?status=pending").json()
    assert body["total"] == 1
    assert tenant.sponsor_client.get("/v1/me/permit-requests").json()["total"] == 0


def test_two_concurrent_approvals_mint_one_permit(transactional_db):
    t = make_tenant("dual")
    preq = ask(t.agent_client, t.agent.wallet_id).json()
    user, _ = approver_for(t)
    barrier = threading.Barrier(2)
    statuses: list[int] = []

    def click():
        c = Client()
        c.force_login(user)
        barrier.wait()
        try:
            statuses.append(c.post(f"/approvals/{preq['request_id']}/decide", approval(preq["request_id"])).status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=click) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert statuses == [302, 302]
    assert Permit.objects.filter(wallet=t.agent).count() == 1
    assert PermitRequest.objects.get(pk=preq["request_id"]).permit_id is not None


def test_a_burst_of_decided_requests_does_not_push_a_pending_one_off_the_queue(tenant, monkeypatch):
    """Pending requests are read apart from decided ones: an older pending request stays on the page
    however many newer ones were decided, and past the page's length it says how many more wait."""
    from datetime import timedelta

    from common.ids import new_id
    from permits import approvals

    first = ask(tenant.agent_client, tenant.agent.wallet_id).json()["request_id"]
    template = PermitRequest.objects.get(request_id=first)
    burst = []
    for n in range(210):
        row = PermitRequest.objects.get(request_id=first)
        row.request_id = new_id("preq")
        row.idempotency_key = f"burst-{n}"
        row.status = "rejected"
        row.created_at = template.created_at + timedelta(seconds=n + 1)
        burst.append(row)
    PermitRequest.objects.bulk_create(burst)
    _user, browser = approver_for(tenant)
    page = browser.get("/approvals/").content.decode()
    assert first in page.split('id="pending"')[1].split("</table>")[0]
    assert 'id="pending-not-shown"' not in page

    ask(tenant.agent_client, tenant.agent.wallet_id, key="second")
    monkeypatch.setattr(approvals, "QUEUE_PENDING_SHOWN", 1)
    page = browser.get("/approvals/").content.decode()
    assert "1 older pending request not shown" in page


def test_the_card_names_the_wallet_by_its_id_beside_its_label(tenant):
    """The wallet's name is a label whoever created the wallet chose: the card shows the id too."""
    preq = ask(tenant.agent_client, tenant.agent.wallet_id).json()
    html = tenant.agent_client.get(f"/v1/permit-requests/{preq['request_id']}/card").content.decode()
    assert f'data-field="wallet-id"><code style="font-size: .85em;">{tenant.agent.wallet_id}</code>' in html


# -- PERMIT_REQUESTS_PENDING_PER_WALLET (issue 27, item 3) -----------------------------------------


def test_pending_requests_per_wallet_are_capped_and_the_refusal_is_audited(
    tenant, settings, django_capture_on_commit_callbacks
):
    """Each request emails the approvers: past the cap the agent is refused (409) and nobody is emailed."""
    settings.PERMIT_REQUESTS_PENDING_PER_WALLET = 3
    approver_for(tenant)
    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        statuses = [ask(tenant.agent_client, tenant.agent.wallet_id, key=f"r{i}").status_code for i in range(3)]
    assert statuses == [202] * 3
    assert len(mail.outbox) == 3
    with django_capture_on_commit_callbacks(execute=True):
        r = ask(tenant.agent_client, tenant.agent.wallet_id, key="r3")
    assert r.status_code == 409, r.content
    detail = r.json()["detail"]
    assert (detail["error"], detail["limit"], detail["pending"]) == ("permit_request_limit_reached", 3, 3)
    assert len(mail.outbox) == 3
    assert PermitRequest.objects.count() == 3
    event = AuditEvent.objects.get(event="permit_request.limit_reached")
    assert (event.ok, event.wallet_id, event.key_id) == (False, tenant.agent.wallet_id, tenant.agent_key_id)
    # A replay of an accepted request is still answered; it creates nothing.
    assert ask(tenant.agent_client, tenant.agent.wallet_id, key="r0").status_code == 202
    # A decided request, and an expired one, free their places.
    first, second = PermitRequest.objects.order_by("created_at")[:2]
    _, browser = approver_for(tenant, "bob")
    browser.post(f"/approvals/{first.request_id}/decide", {"decision": "reject", "note": ""})
    PermitRequest.objects.filter(pk=second.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert [ask(tenant.agent_client, tenant.agent.wallet_id, key=f"s{i}").status_code for i in range(3)] == [
        202
    ] * 2 + [409]


def test_child_wallets_share_their_agents_pending_requests(tenant, settings):
    """An agent cannot multiply the cap through child wallets; a sibling agent and the sponsor count apart."""
    from tests import factories

    settings.PERMIT_REQUESTS_PENDING_PER_WALLET = 2
    child_a = factories.make_wallet(tenant.agent, "child-a")
    child_b = factories.make_wallet(tenant.agent, "child-b")
    agent = tenant.agent_client
    assert ask(agent, child_a.wallet_id, key="a").status_code == 202
    assert ask(agent, child_b.wallet_id, key="b").status_code == 202
    r = ask(agent, tenant.agent.wallet_id, key="c")
    assert r.status_code == 409, r.content
    assert ask(client_for_wallet(child_a), child_a.wallet_id, key="d").status_code == 409
    sibling = factories.make_wallet(tenant.sponsor, "sibling")
    assert ask(client_for_wallet(sibling), sibling.wallet_id, key="e").status_code == 202
    assert ask(tenant.sponsor_client, tenant.sponsor.wallet_id, key="f").status_code == 202


def client_for_wallet(wallet):
    from tests import factories
    from tests.conftest import client_for

    return client_for(factories.make_key(wallet).secret)


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_never_pass_the_pending_cap(settings):
    """Six requests at once with room for two: two pending, four refused, under the line wallet's row lock."""
    from concurrent.futures import ThreadPoolExecutor

    from permits.exceptions import PermitRequestLimitReached

    settings.PERMIT_REQUESTS_PENDING_PER_WALLET = 2
    t = make_tenant("burst")
    barrier = threading.Barrier(6)

    def request(i: int) -> str:
        barrier.wait()
        try:
            services.permit_request_create(
                wallet=t.agent,
                requested_by_key_id=t.agent_key_id,
                allowed_tools=["demo.echo"],
                max_credits=Decimal("5"),
                max_calls=None,
                permit_ttl_seconds=600,
                subject_key_id=None,
                justification="",
                idempotency_scope=t.agent_key_id,
                idempotency_key=f"race{i}",
                request_hash=f"{i:064d}",
            )
            return "created"
        except PermitRequestLimitReached:
            return "refused"
        finally:
            connection.close()

    with ThreadPoolExecutor(6) as pool:
        outcomes = list(pool.map(request, range(6)))
    assert sorted(outcomes) == ["created"] * 2 + ["refused"] * 4
    assert PermitRequest.objects.filter(wallet=t.agent, status="pending").count() == 2
    assert AuditEvent.objects.filter(event="permit_request.limit_reached").count() == 4
