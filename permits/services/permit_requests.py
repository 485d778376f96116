"""Permit requests and human approval: a request for a permit, the email to the tenant's approvers,
their decision (approving mints the permit), and adding and removing approvers from the console.

Every service that changes state owns its transaction and writes its audit event inside it as
the last statement.
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.template.loader import render_to_string
from django.utils import timezone

from billing.exceptions import money
from billing.models import Wallet, WalletType
from common.canonical import canonical_bytes, sha256_hex
from common.formatting import credits_phrase
from common.ids import new_id
from common.jsonbody import check_storable
from permits import exceptions as exc
from permits.models import PermitApproval, PermitRequest, PermitRequestStatus, TenantApprover, TenantNotification
from permits.services.approval_record import approval_record_sign, approval_reference
from permits.services.notifications import webhook_queue
from permits.services.permits import PermitTerms, _check_subject_key, _created_before, _mint_permit
from permits.services.rows import wallet_row_audit

logger = logging.getLogger("tollgate.permits")

PERMIT_REQUEST_LIFETIME = timedelta(hours=24)


@dataclass(frozen=True)
class RequestCreate:
    permit_request: PermitRequest
    replayed: bool


def permit_request_create(
    *,
    wallet: Wallet,
    requested_by_key_id: str,
    allowed_tools: list[str],
    max_credits: Decimal,
    max_calls: int | None,
    permit_ttl_seconds: int,
    subject_key_id: str | None,
    justification: str,
    allowed_servers: list[str] | None = None,
    idempotency_scope: str,
    idempotency_key: str,
    request_hash: str,
) -> RequestCreate:
    """Record a pending request and notify the tenant's approvers after commit.

    Idempotent per (scope, key) like ``permit_issue``. Creating or listing
    requests never advances a decision. ``allowed_servers``: the upstream servers (slugs) the
    permit would cover (None: any); an approval mints the permit with exactly these.
    """
    existing = _created_before(PermitRequest, idempotency_scope, idempotency_key, request_hash)
    if existing is not None:
        return RequestCreate(permit_request=existing, replayed=True)
    _check_subject_key(wallet, subject_key_id)
    now = timezone.now()
    try:
        with transaction.atomic(durable=True):
            _require_pending_room(wallet, now)
            preq = PermitRequest.objects.create(
                request_id=new_id("preq"),
                tenant_id=wallet.tenant_id,
                wallet=wallet,
                requested_by_key_id=requested_by_key_id,
                allowed_tools=sorted(set(allowed_tools)),
                allowed_servers=sorted(set(allowed_servers)) if allowed_servers is not None else None,
                max_credits=max_credits,
                max_calls=max_calls,
                permit_ttl_seconds=permit_ttl_seconds,
                subject_key_id=subject_key_id,
                justification=justification,
                expires_at=now + PERMIT_REQUEST_LIFETIME,
                created_at=now,
                idempotency_scope=idempotency_scope,
                idempotency_key=idempotency_key,
                request_hash=request_hash,
            )
            request_id = preq.request_id
            # The webhook's delivery row commits with the request; deliver_webhooks sends it.
            webhook_queue(preq=preq, approval_url=approval_url(request_id))
            transaction.on_commit(lambda: permit_request_notify(request_id=request_id))
            wallet_row_audit(
                "permit_request.created",
                wallet,
                key_id=requested_by_key_id,
                endpoint="/v1/permit-requests",
                detail={
                    "request_id": preq.request_id,
                    "allowed_tools": preq.allowed_tools,
                    **({"allowed_servers": preq.allowed_servers} if preq.allowed_servers is not None else {}),
                },
            )
    except IntegrityError:
        existing = _created_before(PermitRequest, idempotency_scope, idempotency_key, request_hash)
        if existing is None:
            raise
        return RequestCreate(permit_request=existing, replayed=True)
    except exc.PermitRequestLimitReached as refused:
        # Audited in a transaction of its own: the refused one rolled back.
        wallet_row_audit(
            "permit_request.limit_reached",
            wallet,
            ok=False,
            key_id=requested_by_key_id,
            endpoint="/v1/permit-requests",
            detail={
                "line_wallet_id": wallet.line_id,
                "limit": refused.extra["limit"],
                "pending": refused.extra["pending"],
            },
        )
        raise
    return RequestCreate(permit_request=preq, replayed=False)


def _require_pending_room(wallet: Wallet, now: Any) -> None:
    """Refuse a request when the wallet's line (an agent with its child wallets, or a sponsor wallet;
    ``Wallet.line_id``) has ``PERMIT_REQUESTS_PENDING_PER_WALLET`` requests awaiting a decision (409
    ``permit_request_limit_reached``): each one emails the approvers. Pending means undecided and not
    expired. Counted under the line wallet's row lock (an ancestor first, as the lock order has it),
    which every request of the line takes, so concurrent requests cannot both see the last place.
    """
    line = wallet.line_id
    Wallet.objects.select_for_update(no_key=True, of=("self",)).filter(wallet_id=line).first()
    limit = settings.PERMIT_REQUESTS_PENDING_PER_WALLET
    pending = (
        PermitRequest.objects.filter(status=PermitRequestStatus.PENDING, expires_at__gt=now)
        .filter(Q(wallet_id=line) | Q(wallet__parent_id=line, wallet__wallet_type=WalletType.CHILD))
        .count()
    )
    if pending >= limit:
        raise exc.PermitRequestLimitReached(wallet_id=wallet.wallet_id, limit=limit, pending=pending)


def approval_url(request_id: str) -> str:
    return f"{settings.PUBLIC_BASE_URL.rstrip('/')}/approvals/{request_id}"


def permit_request_notify(*, request_id: str) -> int:
    """Email the tenant's approvers the request card and a link to the approval page (unless the
    tenant turned email off; its webhook, if any, is ``notifications.webhook_queue``'s).

    Runs after the creating transaction commits. A delivery failure is logged and
    does not affect the request (approvers also see the queue page).
    """
    preq = PermitRequest.objects.select_related("wallet").get(request_id=request_id)
    notification = TenantNotification.objects.filter(tenant_id=preq.tenant_id).first()
    if notification is not None and not notification.email_enabled:
        return 0
    recipients = sorted(
        {
            email
            for email in TenantApprover.objects.filter(tenant_id=preq.tenant_id).values_list("user__email", flat=True)
            if email
        }
    )
    if not recipients:
        return 0
    from permits.selectors import permit_request_card_context

    context = {
        **permit_request_card_context(preq, approval_url=approval_url(preq.request_id)),
        "show_decide_link": True,
    }
    html = render_to_string("permits/card.html", context)
    servers = "any" if preq.allowed_servers is None else ", ".join(preq.allowed_servers) or "none"
    text = (
        f"Permit request {preq.request_id} from wallet {preq.wallet_id}\n"
        f"Tools: {', '.join(preq.allowed_tools)}\nServers: {servers}\nUp to {credits_phrase(preq.max_credits)}\n"
        f"Reason: {preq.justification or '-'}\n\nReview it: {context['approval_url']}\n"
    )
    try:
        return send_mail(
            subject=f"[Tollgate] Permit request {preq.request_id} needs a decision",
            message=text,
            from_email=None,
            recipient_list=recipients,
            html_message=html,
        )
    except Exception:
        logger.exception("could not send the approval notification for %s", request_id)
        return 0


def user_is_approver(user: Any, tenant_id: str) -> bool:
    return bool(user.is_authenticated and TenantApprover.objects.filter(user_id=user.pk, tenant_id=tenant_id).exists())


def permit_request_terms(preq: PermitRequest) -> str:
    """A digest of the terms a permit would be minted from: what the approval page shows the approver.

    The page sends it back with the decision; an approval whose digest no longer matches the row
    (someone changed the request after the approver saw it) mints nothing (``RequestTermsChanged``).
    """
    terms = {
        "request_id": preq.request_id,
        "tenant_id": preq.tenant_id,
        "wallet_id": preq.wallet_id,
        "allowed_tools": list(preq.allowed_tools),
        "allowed_servers": None if preq.allowed_servers is None else list(preq.allowed_servers),
        "max_credits": money(preq.max_credits),
        "max_calls": preq.max_calls,
        "permit_ttl_seconds": preq.permit_ttl_seconds,
        "subject_key_id": preq.subject_key_id or None,
    }
    return sha256_hex(canonical_bytes(terms))


def _same_terms(shown: str, current: str) -> bool:
    """Whether the digest a form sent back is ``current``. Compared as bytes: ``hmac.compare_digest``
    raises TypeError on a str that is not ASCII, and a digest is hex, so any other text is a mismatch."""
    return shown.isascii() and hmac.compare_digest(shown.encode("ascii"), current.encode("ascii"))


@transaction.atomic(durable=True)
def permit_request_decide(
    *, request_id: str, user: Any, approve: bool, note: str = "", shown_terms: str | None = None
) -> PermitRequest:
    """Approve (minting exactly one permit) or reject a pending request.

    Locks the request row, then re-checks: a decided request cannot be decided
    again (409), an expired one cannot be approved, and only approvers of the
    request's tenant may decide. Two concurrent approvals mint one permit.
    ``shown_terms``: the ``permit_request_terms`` digest of the page the approver decided on
    (the approval page always sends it); an approval is refused (409) unless the row still
    has those terms. A ``note`` PostgreSQL cannot store (NUL, a lone surrogate) is 422 before
    anything is read; the approval page checks its form first and shows its own error.
    The decision is a signed ``permit_approval`` statement (``approval_record_sign``: request,
    tenant, wallet, decision, approver, time and, for an approval, the permit and the digest of
    its terms), and the permit's statement names it; its digest is in the decision's audit event.
    """
    check_storable(note, ["note"])
    preq = PermitRequest.objects.select_for_update(no_key=True).select_related("wallet").get(request_id=request_id)
    if not user_is_approver(user, preq.tenant_id):
        raise exc.NotAnApprover()
    now = timezone.now()
    if preq.status != PermitRequestStatus.PENDING:
        raise exc.RequestAlreadyDecided(request_id=request_id, status=preq.status)
    if preq.expires_at <= now:
        raise exc.RequestExpired(request_id=request_id)
    if approve and shown_terms is not None and not _same_terms(shown_terms, permit_request_terms(preq)):
        raise exc.RequestTermsChanged(request_id=request_id)
    preq.decided_at = now
    preq.decided_by = user
    preq.decision_note = note[:500]
    signed: list[tuple[PermitApproval, str]] = []

    def sign_approval(terms: dict[str, Any]) -> dict[str, Any]:
        signed.append(approval_record_sign(preq=preq, user=user, decided_at=now, permit_terms=terms))
        return approval_reference(signed[0][0])

    if approve:
        tenant_root = Wallet.objects.get(wallet_id=preq.tenant_id)
        permit = _mint_permit(
            terms=PermitTerms(
                wallet=preq.wallet,
                issuer_wallet=tenant_root,
                allowed_tools=list(preq.allowed_tools),
                # Exactly the servers asked for, as the tools: the approver approves the request as shown.
                allowed_servers=None if preq.allowed_servers is None else list(preq.allowed_servers),
                max_credits=preq.max_credits,
                max_calls=preq.max_calls,
                expires_at=now + timedelta(seconds=preq.permit_ttl_seconds),
                subject_key_id=preq.subject_key_id,
            ),
            via_request_id=preq.request_id,
            approval=sign_approval,
            now=now,
        )
        preq.permit = permit
        preq.status = PermitRequestStatus.APPROVED
    else:
        signed.append(approval_record_sign(preq=preq, user=user, decided_at=now, permit_terms=None))
        preq.status = PermitRequestStatus.REJECTED
    approval, approval_digest = signed[0]
    preq.save(update_fields=["status", "decided_at", "decided_by", "decision_note", "permit"])
    wallet_row_audit(
        "permit_request.approved" if approve else "permit_request.rejected",
        preq,
        endpoint=f"/approvals/{request_id}",
        detail={
            "request_id": request_id,
            "decided_by": user.get_username(),
            "permit_id": preq.permit_id,
            "approval_id": approval.approval_id,
            "approval_sha256": approval_digest,
        },
    )
    return preq


@transaction.atomic(durable=True)
def tenant_approver_add(*, user: Any, tenant: Wallet, actor: str) -> TenantApprover:
    """Make ``user`` an approver of ``tenant``'s permit requests (the console), audited. Idempotent."""
    approver, created = TenantApprover.objects.get_or_create(user=user, tenant=tenant)
    if created:
        wallet_row_audit("approver.added", tenant, detail={"user": user.get_username(), "actor": actor})
    return approver


@transaction.atomic  # not durable: the console's delete view runs inside its own transaction
def tenant_approver_remove(*, approver: TenantApprover, actor: str) -> None:
    """Stop ``approver`` approving for its tenant (the console), audited."""
    tenant = approver.tenant
    username = approver.user.get_username()
    if TenantApprover.objects.filter(pk=approver.pk).delete()[0]:
        wallet_row_audit("approver.removed", tenant, detail={"user": username, "actor": actor})
