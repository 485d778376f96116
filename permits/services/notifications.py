"""How a tenant's approvers hear of a permit request: email and a signed webhook (docs/decisions.md,
Human approval, "Approver notification").

A webhook delivery is a row written in the transaction that creates the request (``webhook_queue``)
and sent after it commits by ``manage.py deliver_webhooks`` (``make run`` runs it in a loop next to
the dispatch sweeper), never by the request that created it. Each attempt is a JSON POST, signed with
HMAC-SHA256 over ``<timestamp>.<body>`` with the tenant's secret; a 2xx answer delivers it, anything
else (a redirect, an error, a timeout) is retried with backoff until ``WEBHOOK_MAX_ATTEMPTS``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.services import audit_record
from billing.models import Wallet
from common.formatting import credits_phrase
from common.ids import new_id
from permits.models import (
    PermitRequest,
    TenantApprover,
    TenantNotification,
    WebhookDelivery,
    WebhookDeliveryStatus,
)
from permits.services.rows import wallet_row_audit

logger = logging.getLogger("tollgate.permits")

SIGNATURE_HEADER = "X-Tollgate-Signature"
TIMESTAMP_HEADER = "X-Tollgate-Timestamp"
DELIVERY_HEADER = "X-Tollgate-Delivery"
# A claimed delivery is not claimed again for this long (a sender that died mid-attempt is retried).
CLAIM_LEASE = timedelta(seconds=120)
# Email backends that send nothing anywhere an approver reads.
UNDELIVERED_EMAIL_BACKENDS = {
    "django.core.mail.backends.console.EmailBackend": "prints email to the server's console",
    "django.core.mail.backends.dummy.EmailBackend": "discards email",
    "django.core.mail.backends.locmem.EmailBackend": "keeps email in memory",
    "django.core.mail.backends.filebased.EmailBackend": "writes email to files",
}


def webhook_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a webhook, if it cannot: http or https with a host, nothing else."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "The webhook address must be an http:// or https:// URL with a host."
    if parts.username or parts.password:
        return "The webhook address cannot carry a user name or password; the signature authenticates."
    return None


def webhook_signature(*, secret: str, timestamp: int, body: bytes) -> str:
    """``sha256=<hex>``: HMAC-SHA256 with ``secret`` over ``<timestamp>.`` followed by the body bytes."""
    mac = hmac.new(secret.encode("utf-8"), f"{timestamp}.".encode("ascii") + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


def approval_sign_in_url() -> str:
    """Where approvers sign in (and find their queue)."""
    return f"{settings.PUBLIC_BASE_URL.rstrip('/')}/approvals/"


@dataclass(frozen=True)
class Reachability:
    """Whether a tenant's approvers hear of a request, and why not."""

    reachable: bool
    problems: list[str]


def email_backend_problem() -> str | None:
    backend = settings.EMAIL_BACKEND
    if backend in UNDELIVERED_EMAIL_BACKENDS:
        kind = backend.rsplit(".", 2)[-2]
        return f"EMAIL_BACKEND is the {kind} backend, which {UNDELIVERED_EMAIL_BACKENDS[backend]}: no approver gets it"
    return None


def approver_reachability(tenant_id: str) -> Reachability:
    """Whether a new permit request of ``tenant_id`` reaches a person, with every reason it may not:
    no approver, approvers without an email address, email turned off or sent nowhere, no webhook."""
    notification = TenantNotification.objects.filter(tenant_id=tenant_id).first()
    email_on = notification is None or notification.email_enabled
    webhook = bool(notification and notification.webhook_url and notification.webhook_secret)
    approvers = list(TenantApprover.objects.filter(tenant_id=tenant_id).select_related("user"))
    problems: list[str] = []
    if not approvers:
        problems.append("no approver: add one under Tenant approvers")
    without_email = sorted(a.user.get_username() for a in approvers if not a.user.email)
    backend_problem = email_backend_problem()
    if not email_on:
        problems.append("email to approvers is off for this tenant")
    elif backend_problem:
        problems.append(backend_problem)
    if email_on and without_email:
        problems.append(f"no email address: {', '.join(without_email)}")
    if not webhook:
        problems.append("no webhook")
    email_reaches = email_on and backend_problem is None and len(without_email) < len(approvers)
    return Reachability(reachable=bool(approvers) and (webhook or email_reaches), problems=problems)


def webhook_body(preq: PermitRequest, *, approval_url: str) -> bytes:
    """The JSON sent for a new request: ``text`` for Slack and Teams incoming webhooks, and the fields."""
    wallet = preq.wallet
    tools = ", ".join(preq.allowed_tools)
    if preq.allowed_servers is not None:
        tools += f" (only on {', '.join(preq.allowed_servers) or 'no server'})"
    text = (
        f"Permit request {preq.request_id}: {wallet.name or wallet.wallet_id} asks for {tools}, "
        f"up to {credits_phrase(preq.max_credits)}. Reason: {preq.justification or '(none given)'}. "
        f"Decide: {approval_url}"
    )
    document = {
        "text": text,
        "event": "permit_request.created",
        "request_id": preq.request_id,
        "tenant_id": preq.tenant_id,
        "wallet_id": preq.wallet_id,
        "allowed_tools": list(preq.allowed_tools),
        "allowed_servers": None if preq.allowed_servers is None else list(preq.allowed_servers),
        "max_credits": f"{preq.max_credits:f}",
        "justification": preq.justification,
        "expires_at": preq.expires_at.isoformat(),
        "approval_url": approval_url,
    }
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def webhook_queue(*, preq: PermitRequest, approval_url: str) -> WebhookDelivery | None:
    """Record the webhook delivery of a new request, if its tenant has a webhook. The caller's
    transaction (the request's creation) writes it; ``deliver_webhooks`` sends it after commit."""
    notification = TenantNotification.objects.filter(tenant_id=preq.tenant_id).first()
    if notification is None or not notification.webhook_url or not notification.webhook_secret:
        return None
    now = timezone.now()
    return WebhookDelivery.objects.create(
        delivery_id=new_id("whd"),
        tenant_id=preq.tenant_id,
        permit_request=preq,
        url=notification.webhook_url,
        body=webhook_body(preq, approval_url=approval_url).decode("utf-8"),
        next_attempt_at=now,
        created_at=now,
    )


def retry_delay(attempts: int) -> timedelta:
    """The wait after the ``attempts``-th failed attempt: the base, doubled each time, at most an hour."""
    return timedelta(seconds=min(settings.WEBHOOK_RETRY_BASE_SECONDS * 2 ** (attempts - 1), 3600.0))


@transaction.atomic(durable=True)
def _claim_due(now: datetime, limit: int) -> list[WebhookDelivery]:
    due = list(
        WebhookDelivery.objects.select_for_update(skip_locked=True)
        .filter(status=WebhookDeliveryStatus.PENDING, next_attempt_at__lte=now)
        .order_by("next_attempt_at")[:limit]
    )
    for delivery in due:
        delivery.attempts += 1
        delivery.next_attempt_at = now + CLAIM_LEASE
        delivery.save(update_fields=["attempts", "next_attempt_at"])
    return due


def _send(delivery: WebhookDelivery, secret: str) -> tuple[int | None, str]:
    """One POST; the answer's status and, unless it is a 2xx, why it failed. Follows no redirect."""
    body = delivery.body.encode("utf-8")
    timestamp = int(timezone.now().timestamp())
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Tollgate-Webhook/1",
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: webhook_signature(secret=secret, timestamp=timestamp, body=body),
        DELIVERY_HEADER: delivery.delivery_id,
    }
    timeout = settings.WEBHOOK_TIMEOUT_SECONDS
    try:
        with httpx.Client(follow_redirects=False, trust_env=False, timeout=timeout) as client:
            answer = client.post(delivery.url, content=body, headers=headers)
    except httpx.HTTPError as err:
        return None, f"{type(err).__name__}: {str(err)[:300]}"
    if 200 <= answer.status_code < 300:
        return answer.status_code, ""
    if 300 <= answer.status_code < 400:
        return answer.status_code, f"HTTP {answer.status_code}: redirects are not followed"
    return answer.status_code, f"HTTP {answer.status_code}"


@transaction.atomic(durable=True)
def _record(delivery_id: str, status_code: int | None, error: str, now: datetime) -> WebhookDelivery:
    delivery = WebhookDelivery.objects.select_for_update().get(pk=delivery_id)
    delivery.last_status_code = status_code
    delivery.last_error = error[:500]
    if not error:
        delivery.status = WebhookDeliveryStatus.DELIVERED
        delivery.delivered_at = now
    elif delivery.attempts >= settings.WEBHOOK_MAX_ATTEMPTS:
        delivery.status = WebhookDeliveryStatus.FAILED
    else:
        delivery.next_attempt_at = now + retry_delay(delivery.attempts)
    delivery.save(update_fields=["last_status_code", "last_error", "status", "delivered_at", "next_attempt_at"])
    if delivery.status != WebhookDeliveryStatus.PENDING:
        audit_record(
            event="permit_request.webhook_delivered" if not error else "permit_request.webhook_failed",
            ok=not error,
            tenant_id=delivery.tenant_id,
            detail={
                "delivery_id": delivery.delivery_id,
                "request_id": delivery.permit_request_id,
                "attempts": delivery.attempts,
                "status_code": status_code,
            },
        )
    return delivery


def webhook_deliver_due(*, now: datetime | None = None, limit: int = 20) -> list[WebhookDelivery]:
    """Send every pending delivery whose time has come (at most ``limit``) and record each outcome.

    Several senders may run: a delivery is claimed (``SKIP LOCKED``, its next attempt pushed past a
    lease) in one transaction, sent outside any transaction, and its outcome recorded in another.
    A sender that dies mid-attempt leaves the delivery to be retried when the lease ends, so a
    receiver may see a delivery twice: ``X-Tollgate-Delivery`` names it.
    """
    now = now or timezone.now()
    results = []
    for delivery in _claim_due(now, limit):
        notification = TenantNotification.objects.filter(tenant_id=delivery.tenant_id).first()
        secret = notification.webhook_secret if notification is not None else ""
        if not secret:
            status_code, error = None, "the tenant's webhook secret was removed"
        else:
            status_code, error = _send(delivery, secret)
        if error:
            logger.warning("webhook delivery %s attempt %d failed: %s", delivery.delivery_id, delivery.attempts, error)
        results.append(_record(delivery.delivery_id, status_code, error, now))
    return results


@transaction.atomic(durable=True)
def tenant_notification_set(
    *, tenant: Wallet, email_enabled: bool, webhook_url: str, webhook_secret: str | None, actor: str
) -> TenantNotification:
    """Set how ``tenant``'s approvers are notified, audited (the secret never: only that it changed).

    ``webhook_secret`` None keeps the stored secret; an empty ``webhook_url`` removes the webhook and
    its secret. A webhook address must be http(s) (``webhook_url_problem``) and needs a secret.
    """
    from common.errors import RequestValidationError

    if webhook_url:
        problem = webhook_url_problem(webhook_url)
        if problem:
            raise RequestValidationError.single(["webhook_url"], problem, "invalid_url")
    notification, _ = TenantNotification.objects.select_for_update().get_or_create(tenant=tenant)
    secret_changed = False
    if not webhook_url:
        secret_changed = bool(notification.webhook_secret)
        notification.webhook_secret, notification.webhook_secret_set_at = "", None
    elif webhook_secret:
        secret_changed = True
        notification.webhook_secret, notification.webhook_secret_set_at = webhook_secret, timezone.now()
    if webhook_url and not notification.webhook_secret:
        raise RequestValidationError.single(["webhook_secret"], "A webhook needs a signing secret.", "required")
    notification.email_enabled = email_enabled
    notification.webhook_url = webhook_url
    notification.save()
    wallet_row_audit(
        "approver_notification.changed",
        tenant,
        detail={
            "email_enabled": email_enabled,
            # The host only: a Slack or Teams incoming-webhook address carries its own token.
            "webhook_host": urlsplit(webhook_url).hostname or "",
            "webhook_secret_changed": secret_changed,
            "actor": actor,
        },
    )
    return notification


def notification_summary(tenant_id: str) -> dict[str, Any]:
    """For the console: the channels and whether the approvers are reachable."""
    reach = approver_reachability(tenant_id)
    return {"reachable": reach.reachable, "problems": reach.problems, "sign_in_url": approval_sign_in_url()}
