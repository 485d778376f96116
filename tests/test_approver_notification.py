"""Approver notification (issue 30, item 4): a signed webhook per tenant, delivered after the request
commits by ``deliver_webhooks`` with retries and backoff, recorded; email per tenant; the reachability
the console warns about."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.core import mail
from django.utils import timezone

from audit.models import AuditEvent
from common.errors import RequestValidationError
from permits.models import PermitRequest, WebhookDelivery
from permits.services import approver_reachability, tenant_notification_set, webhook_deliver_due
from permits.services.notifications import DELIVERY_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER
from tests.test_permit_requests import approver_for, ask

pytestmark = pytest.mark.django_db
SECRET = "whsec-for-tests-only-7f3a"


class Receiver:
    """A real HTTP server on 127.0.0.1 (a free port) answering each POST with the next planned status."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = list(statuses)
        self.received: list[dict[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.received.append({"path": self.path, "headers": dict(self.headers), "body": body})
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", "/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def signed_correctly(message: dict[str, Any]) -> bool:
    timestamp = message["headers"][TIMESTAMP_HEADER]
    expected = hmac.new(SECRET.encode(), f"{timestamp}.".encode() + message["body"], hashlib.sha256).hexdigest()
    return hmac.compare_digest(message["headers"][SIGNATURE_HEADER], f"sha256={expected}")


def test_a_request_is_posted_signed_retried_with_backoff_and_recorded(
    tenant, django_capture_on_commit_callbacks, caplog
):
    caplog.set_level(logging.DEBUG)
    with Receiver([500, 200]) as receiver:
        tenant_notification_set(
            tenant=tenant.sponsor, email_enabled=False, webhook_url=receiver.url, webhook_secret=SECRET, actor="t"
        )
        mail.outbox.clear()
        with django_capture_on_commit_callbacks(execute=True):
            r = ask(tenant.agent_client, tenant.agent.wallet_id, key="hook")
        assert r.status_code == 202
        request_id = r.json()["request_id"]
        assert receiver.received == []  # creating the request sent nothing: the sender does, later
        assert mail.outbox == []  # email is off for this tenant
        delivery = WebhookDelivery.objects.get(permit_request_id=request_id)
        assert (delivery.status, delivery.attempts) == ("pending", 0)

        t0 = timezone.now()
        [first] = webhook_deliver_due(now=t0)
        assert (first.status, first.attempts, first.last_status_code) == ("pending", 1, 500)
        assert first.next_attempt_at == t0 + timedelta(seconds=30)
        assert webhook_deliver_due(now=t0 + timedelta(seconds=29)) == []  # backing off
        [second] = webhook_deliver_due(now=t0 + timedelta(seconds=31))
        assert (second.status, second.attempts, second.last_status_code) == ("delivered", 2, 200)
        assert webhook_deliver_due(now=t0 + timedelta(hours=2)) == []  # delivered once, done

    assert len(receiver.received) == 2
    for message in receiver.received:
        assert signed_correctly(message)
        assert message["headers"][DELIVERY_HEADER] == delivery.delivery_id
        assert message["headers"]["Content-Type"] == "application/json"
        document = json.loads(message["body"])
        assert document["request_id"] == request_id
        assert document["approval_url"].endswith(f"/approvals/{request_id}")
        assert "5.00 credits" in document["text"]  # a Slack or Teams incoming webhook shows "text"
    tampered = {**receiver.received[0], "body": receiver.received[0]["body"] + b" "}
    assert not signed_correctly(tampered)
    delivered = AuditEvent.objects.get(event="permit_request.webhook_delivered")
    assert delivered.detail["attempts"] == 2
    # The secret is write-only: in no audit event and no log line.
    assert not AuditEvent.objects.filter(detail__icontains=SECRET).exists()
    assert SECRET not in caplog.text
    assert SECRET not in json.dumps([e.detail for e in AuditEvent.objects.all()])


def test_redirects_are_not_followed_and_a_delivery_gives_up(tenant, settings):
    settings.WEBHOOK_MAX_ATTEMPTS = 2
    with Receiver([302, 503]) as receiver:
        tenant_notification_set(
            tenant=tenant.sponsor, email_enabled=True, webhook_url=receiver.url, webhook_secret=SECRET, actor="t"
        )
        assert ask(tenant.agent_client, tenant.agent.wallet_id, key="redir").status_code == 202
        t0 = timezone.now()
        [first] = webhook_deliver_due(now=t0)
        assert "redirects are not followed" in first.last_error
        assert [m["path"] for m in receiver.received] == ["/hook"]  # /elsewhere never asked
        [second] = webhook_deliver_due(now=t0 + timedelta(minutes=5))
        assert (second.status, second.attempts, second.last_status_code) == ("failed", 2, 503)
    assert AuditEvent.objects.filter(event="permit_request.webhook_failed").count() == 1


def test_webhook_addresses_are_http_only_and_need_a_secret(tenant):
    for url in ("ftp://hooks.example/x", "file:///etc/passwd", "javascript:alert(1)", "https://user:pw@h.example/"):
        with pytest.raises(RequestValidationError):
            tenant_notification_set(
                tenant=tenant.sponsor, email_enabled=True, webhook_url=url, webhook_secret="s", actor="t"
            )
    with pytest.raises(RequestValidationError):
        tenant_notification_set(
            tenant=tenant.sponsor, email_enabled=True, webhook_url="https://h.example/", webhook_secret=None, actor="t"
        )
    # Once set, the secret is kept when the form leaves it empty (it is never shown to be re-entered).
    tenant_notification_set(
        tenant=tenant.sponsor, email_enabled=True, webhook_url="https://h.example/", webhook_secret="s1", actor="t"
    )
    kept = tenant_notification_set(
        tenant=tenant.sponsor, email_enabled=False, webhook_url="https://h.example/2", webhook_secret=None, actor="t"
    )
    assert kept.webhook_secret == "s1"


def test_reachability_names_every_reason(tenant, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
    reach = approver_reachability(tenant.sponsor.wallet_id)
    assert not reach.reachable
    assert any("no approver" in p for p in reach.problems)
    user, _ = approver_for(tenant, "noemail")
    user.email = ""
    user.save(update_fields=["email"])
    reach = approver_reachability(tenant.sponsor.wallet_id)
    assert not reach.reachable
    assert any("console backend" in p for p in reach.problems), reach.problems
    assert any("no email address: noemail" in p for p in reach.problems)
    assert "no webhook" in reach.problems
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    assert not approver_reachability(tenant.sponsor.wallet_id).reachable  # still no address
    tenant_notification_set(
        tenant=tenant.sponsor, email_enabled=True, webhook_url="https://h.example/", webhook_secret="s", actor="t"
    )
    assert approver_reachability(tenant.sponsor.wallet_id).reachable
    assert PermitRequest.objects.count() == 0


@pytest.mark.parametrize(
    ("group", "may_add"), [("Approver admin", True), ("Operator", True), ("Read-only auditor", False)]
)
def test_the_roles_that_set_notifications(tenant, group, may_add):
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.test import Client

    user = get_user_model().objects.create_user(f"u-{group}", password="pw-roles-12345", is_staff=True)
    user.groups.add(Group.objects.get(name=group))
    client = Client()
    client.force_login(user)
    assert client.get("/admin/permits/tenantnotification/").status_code == 200
    assert client.get("/admin/permits/webhookdelivery/").status_code == 200
    assert client.get("/admin/permits/tenantnotification/add/").status_code == (200 if may_add else 403)
