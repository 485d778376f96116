"""Authority writes: permits, allowance reservations, permit requests, quotes, policies.

Every service that changes state owns its transaction and writes its audit
event inside it as the last statement. The building blocks the gateway runs in
its own phase-1 transaction (``permit_reserve``, ``permit_release``,
``quote_consume``, ``authorize``) say so and take no transaction of their own.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, TypeVar

from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.template.loader import render_to_string
from django.utils import timezone

from audit.canonical import iso_utc
from audit.services import audit_record
from audit.signing import sign_statement, statement_problem
from billing.exceptions import money
from billing.models import Wallet
from billing.selectors import tool_price, wallet_spend
from config import fastsql
from config.errors import IdempotencyKeyReused, RequestValidationError
from config.ids import new_id
from permits import exceptions as exc
from permits.models import (
    Permit,
    PermitRequest,
    PermitRequestStatus,
    PermitStatus,
    PolicyBundle,
    Quote,
    QuoteStatus,
    TenantApprover,
)

logger = logging.getLogger("tollgate.permits")

M = TypeVar("M", Permit, PermitRequest)

QUOTE_LIFETIME = timedelta(seconds=600)
PERMIT_REQUEST_LIFETIME = timedelta(hours=24)
WILDCARD = "*"


# --- Permits -------------------------------------------------------------------------


def _permit_statement(permit: Permit) -> dict[str, Any]:
    return {
        "type": "permit",
        "permit_id": permit.permit_id,
        "tenant_id": permit.tenant_id,
        "wallet_id": permit.wallet_id,
        "issuer_wallet_id": permit.issuer_wallet_id,
        "subject_key_id": permit.subject_key_id,
        "allowed_tools": list(permit.allowed_tools),
        "max_credits": money(permit.max_credits),
        "max_calls": permit.max_calls,
        "created_at": iso_utc(permit.created_at),
        "expires_at": iso_utc(permit.expires_at),
    }


# The columns authorization and evidence read, each checked against the signed statement at use.
PERMIT_SIGNED_FIELDS = (
    "permit_id",
    "tenant_id",
    "wallet_id",
    "subject_key_id",
    "allowed_tools",
    "max_credits",
    "max_calls",
    "expires_at",
)


def permit_verified_columns(permit: Permit) -> list[Any]:
    """What ``permits_reserve`` requires the row to still carry, after its signed statement verified:
    the signature, then the tenant, wallet, subject key, tools, allowance, call limit and expiry."""
    return [
        permit.signature,
        permit.tenant_id,
        permit.wallet_id,
        permit.subject_key_id,
        json.dumps(list(permit.allowed_tools)),
        permit.max_credits,
        permit.max_calls,
        permit.expires_at,
    ]


def permit_statement_problem(permit: Permit) -> str | None:
    """Why ``permit``'s stored columns cannot be trusted, or None: the one check of a permit at use.

    Every column that authorization reads (``PERMIT_SIGNED_FIELDS``) must equal what
    was signed (``audit.signing.statement_problem``).
    """
    stored = _permit_statement(permit)
    return statement_problem(
        permit.signed_statement,
        permit.signature,
        expected_type="permit",
        columns={name: stored[name] for name in PERMIT_SIGNED_FIELDS},
    )


def _quote_statement(quote: Quote) -> dict[str, Any]:
    return {
        "type": "quote",
        "quote_id": quote.quote_id,
        "tenant_id": quote.tenant_id,
        "wallet_id": quote.wallet_id,
        "tool": quote.tool,
        "quoted_credits": money(quote.quoted_credits),
        "created_at": iso_utc(quote.created_at),
        "expires_at": iso_utc(quote.expires_at),
    }


def quote_statement_problem(quote: Quote) -> str | None:
    """Why ``quote``'s columns (price, tool, wallet, expiry) disagree with its signed statement, or None."""
    return statement_problem(
        quote.signed_statement, quote.signature, expected_type="quote", columns=_quote_statement(quote)
    )


@dataclass(frozen=True)
class PermitIssue:
    """The outcome of ``permit_issue``: the permit and whether this was a replay."""

    permit: Permit
    replayed: bool


def _mint_permit(
    *,
    wallet: Wallet,
    issuer_wallet: Wallet | None,
    issued_by_key_id: str,
    allowed_tools: list[str],
    max_credits: Decimal,
    max_calls: int | None,
    expires_at: datetime,
    subject_key_id: str | None,
    idempotency_scope: str = "",
    idempotency_key: str = "",
    request_hash: str = "",
    via_request_id: str = "",
) -> Permit:
    """Create and sign a permit. Caller holds the transaction."""
    now = timezone.now()
    permit = Permit(
        permit_id=new_id("pmt"),
        tenant_id=wallet.tenant_id,
        wallet=wallet,
        issuer_wallet=issuer_wallet,
        issued_by_key_id=issued_by_key_id,
        issued_via_request_id=via_request_id,
        subject_key_id=subject_key_id,
        allowed_tools=sorted(set(allowed_tools)),
        max_credits=max_credits,
        max_calls=max_calls,
        expires_at=expires_at,
        created_at=now,
        idempotency_scope=idempotency_scope,
        idempotency_key=idempotency_key,
        request_hash=request_hash,
    )
    signed = sign_statement(_permit_statement(permit))
    permit.signed_statement = signed.statement
    permit.signature = signed.signature
    permit.key_id = signed.kid
    permit.save(force_insert=True)
    return permit


def _check_subject_key(wallet: Wallet, subject_key_id: str | None) -> None:
    """A permit (or a request for one) may bind only an active key of its own subject wallet."""
    if subject_key_id is None:
        return
    from billing.models import APIKey

    if not APIKey.objects.filter(key_id=subject_key_id, wallet=wallet, status="active").exists():
        raise RequestValidationError.single(
            ["body", "subject_key_id"], "Not an active API key of the subject wallet.", "value_error"
        )


def human_approval_required(wallet: Wallet) -> bool:
    """True when an enabled policy on the wallet or an ancestor requires human approval."""
    return PolicyBundle.objects.filter(
        wallet_id__in=wallet.ancestry, enabled=True, human_approval_required=True
    ).exists()


def permit_issue(
    *,
    wallet: Wallet,
    issuer_wallet: Wallet | None,
    issued_by_key_id: str,
    allowed_tools: list[str],
    max_credits: Decimal,
    max_calls: int | None,
    expires_at: datetime,
    subject_key_id: str | None,
    idempotency_scope: str,
    idempotency_key: str,
    request_hash: str,
) -> PermitIssue:
    """Issue a signed permit once per (scope, idempotency key).

    The same key with the same request returns the permit issued first
    (``replayed``); with a different request it is the idempotency conflict.
    The issuer must be the subject wallet or above it (the caller checks reach;
    this re-checks the hierarchy). Operator keys issue with no issuer wallet.
    """
    existing = _created_before(Permit, idempotency_scope, idempotency_key, request_hash)
    if existing is not None:
        return PermitIssue(permit=existing, replayed=True)
    if issuer_wallet is not None and issuer_wallet.wallet_id not in wallet.ancestry:
        raise exc.IssuerNotAllowed()
    if issuer_wallet is not None and human_approval_required(wallet):
        raise exc.HumanApprovalRequired(wallet_id=wallet.wallet_id)
    _check_subject_key(wallet, subject_key_id)
    try:
        with transaction.atomic(durable=True):
            permit = _mint_permit(
                wallet=wallet,
                issuer_wallet=issuer_wallet,
                issued_by_key_id=issued_by_key_id,
                allowed_tools=allowed_tools,
                max_credits=max_credits,
                max_calls=max_calls,
                expires_at=expires_at,
                subject_key_id=subject_key_id,
                idempotency_scope=idempotency_scope,
                idempotency_key=idempotency_key,
                request_hash=request_hash,
            )
            audit_record(
                event="permit.issued",
                ok=True,
                tenant_id=wallet.tenant_id,
                wallet_id=wallet.wallet_id,
                key_id=issued_by_key_id or None,
                endpoint="/v1/permits",
                detail={
                    "permit_id": permit.permit_id,
                    "allowed_tools": permit.allowed_tools,
                    "max_credits": money(permit.max_credits),
                },
            )
    except IntegrityError:
        # A concurrent request with the same key won the insert; answer as a replay.
        existing = _created_before(Permit, idempotency_scope, idempotency_key, request_hash)
        if existing is None:
            raise
        return PermitIssue(permit=existing, replayed=True)
    return PermitIssue(permit=permit, replayed=False)


def _created_before(model: type[M], scope: str, key: str, request_hash: str) -> M | None:
    """What this idempotency key already created (replayed as is), or None.

    The same key with a different request is the idempotency conflict (422), nothing written.
    """
    existing = model.objects.filter(idempotency_scope=scope, idempotency_key=key).first()
    if existing is not None and existing.request_hash != request_hash:
        raise IdempotencyKeyReused()
    return existing


@transaction.atomic(durable=True)
def permit_revoke(*, permit_id: str, reason: str = "revoked", actor_key_id: str = "", actor: str = "") -> Permit:
    """Revoke a permit for good. Revoking a revoked permit changes nothing."""
    permit = Permit.objects.select_for_update(no_key=True).get(permit_id=permit_id)
    if permit.status == PermitStatus.REVOKED:
        return permit
    permit.status = PermitStatus.REVOKED
    permit.revoked_at = timezone.now()
    permit.revoke_reason = reason
    permit.save(update_fields=["status", "revoked_at", "revoke_reason"])
    audit_record(
        event="permit.revoked",
        ok=True,
        tenant_id=permit.tenant_id,
        wallet_id=permit.wallet_id,
        key_id=actor_key_id or None,
        endpoint="/v1/permits/{permit_id}/revoke",
        detail={"permit_id": permit.permit_id, "reason": reason, **({"actor": actor} if actor else {})},
    )
    return permit


# Every enabled policy on a wallet's line (its path: ``%s``), oldest first, as one JSON array of the
# fields authorization reads; amounts as strings. For statements that read the policies alongside
# other rows (the governed call's acceptance); ``policies_from_json`` reads it back.
POLICIES_JSON_SQL = (
    "SELECT coalesce(jsonb_agg(jsonb_build_object("
    "'policy_id', b.policy_id, 'allowed_tools', b.allowed_tools, 'denied_tools', b.denied_tools, "
    "'max_credits_per_call', b.max_credits_per_call::text, 'max_daily_credits', b.max_daily_credits::text, "
    "'allowed_categories', b.allowed_categories) ORDER BY b.created_at), '[]'::jsonb) "
    "FROM permits_policy_bundle b WHERE b.wallet_id = ANY(%s) AND b.enabled"
)


def policies_from_json(text: str | list[Any]) -> list[PolicyBundle]:
    """The policies of ``POLICIES_JSON_SQL``'s answer, with the fields ``authorize`` reads."""
    rows = json.loads(text) if isinstance(text, str) else text
    return [
        PolicyBundle(
            policy_id=row["policy_id"],
            allowed_tools=row["allowed_tools"],
            denied_tools=row["denied_tools"],
            max_credits_per_call=Decimal(row["max_credits_per_call"]) if row["max_credits_per_call"] else None,
            max_daily_credits=Decimal(row["max_daily_credits"]) if row["max_daily_credits"] else None,
            allowed_categories=row["allowed_categories"],
        )
        for row in rows
    ]


_RESERVE_SQL = "SELECT permits_reserve(%s, %s, %s)"  # permits/migrations/0004


def permit_reserve(*, permit: Permit, amount: Decimal, now: datetime | None = None) -> None:
    """Reserve ``amount`` and one call against the permit's allowance. Caller holds the transaction.

    The database function ``permits_reserve`` (one conditional UPDATE): it succeeds
    only while the permit is active, unexpired, and the allowance (credits and calls)
    covers the reservation, so concurrent reservations can never spend past
    ``max_credits``. Raises the reason when it fails (``permit_reserve_refusal``).
    """
    now = now or timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(_RESERVE_SQL, [permit.permit_id, amount, now])
        reserved = bool(cursor.fetchone()[0])
    if not reserved:
        raise permit_reserve_refusal(permit_id=permit.permit_id, amount=amount, now=now)


def permit_reserve_refusal(*, permit_id: str, amount: Decimal, now: datetime) -> exc.PermitDenied:
    """Why a reservation of ``amount`` on the permit was refused (read after the refusal)."""
    current = Permit.objects.get(permit_id=permit_id)
    problem = permit_statement_problem(current)
    if problem is not None:  # edited after it was checked: the reservation requires the signed limits
        return exc.PermitSignatureInvalid(permit_id=permit_id, reason=problem)
    status = current.effective_status(now)
    if status == PermitStatus.REVOKED:
        return exc.PermitRevoked(permit_id=permit_id)
    if status == PermitStatus.EXPIRED:
        return exc.PermitExpired(permit_id=permit_id)
    return exc.PermitExhausted(
        permit_id=permit_id,
        max_credits=money(current.max_credits),
        spent_credits=money(current.spent_credits),
        required=money(amount),
    )


def permit_release(*, permit_id: str, amount: Decimal) -> None:
    """Give back a reservation (the call was refunded). Caller holds the transaction."""
    Permit.objects.filter(permit_id=permit_id, spent_credits__gte=amount, calls_used__gte=1).update(
        spent_credits=F("spent_credits") - amount, calls_used=F("calls_used") - 1
    )


# --- Authorization -------------------------------------------------------------------


@dataclass
class Decision:
    """The result of ``authorize``: allowed, or the refusal to raise; always a decision id."""

    policy_decision_id: str
    allowed: bool
    refusal: exc.PermitDenied | None = None
    policies: list[str] = field(default_factory=list)


def tool_allowed(patterns: list[str], tool: str) -> bool:
    """Exact names, ``*`` for any tool, or a ``prefix.*`` namespace pattern."""
    for pattern in patterns:
        if pattern in (WILDCARD, tool):
            return True
        if pattern.endswith(".*") and tool.startswith(pattern[:-1]):
            return True
    return False


def authorize(
    *,
    permit: Permit,
    wallet: Wallet,
    key_id: str,
    tool: str,
    price: Decimal,
    category: str | None = None,
    now: datetime | None = None,
    verify_signature: bool = True,
    policies: list[PolicyBundle] | None = None,
) -> Decision:
    """Evaluate the permit and every enabled policy on the wallet and its ancestors.

    Pure read; the caller records the decision (its ``policy_decision_id``) on
    the audit event and raises ``decision.refusal`` when not allowed. ``policies``:
    the enabled policies of the wallet's line, oldest first, when the caller read
    them already (``POLICIES_JSON_SQL``); else they are read here.
    """
    now = now or timezone.now()
    decision_id = new_id("pdec")

    def deny(err: exc.PermitDenied, policies: list[str] | None = None) -> Decision:
        err.extra.setdefault("policy_decision_id", decision_id)
        return Decision(decision_id, False, err, policies or [])

    if verify_signature:
        # Every column read below must be what was signed (a column edited after signing is tampering).
        problem = permit_statement_problem(permit)
        if problem is not None:
            return deny(exc.PermitSignatureInvalid(permit_id=permit.permit_id, reason=problem))
    if permit.wallet_id != wallet.wallet_id:
        return deny(exc.PermitWalletMismatch(permit_id=permit.permit_id))
    if permit.subject_key_id and permit.subject_key_id != key_id:
        return deny(exc.PermitKeyMismatch(permit_id=permit.permit_id))
    status = permit.effective_status(now)
    if status == PermitStatus.REVOKED:
        return deny(exc.PermitRevoked(permit_id=permit.permit_id))
    if status == PermitStatus.EXPIRED:
        return deny(exc.PermitExpired(permit_id=permit.permit_id))
    if status == PermitStatus.EXHAUSTED or permit.spent_credits + price > permit.max_credits:
        return deny(exc.PermitExhausted(permit_id=permit.permit_id, required=money(price)))
    if not tool_allowed(list(permit.allowed_tools), tool):
        return deny(exc.ToolNotPermitted(permit_id=permit.permit_id, tool=tool))

    if policies is None:
        row = fastsql.fetch_row(POLICIES_JSON_SQL, [wallet.ancestry])
        policies = policies_from_json(row[0] if row is not None else "[]")
    applied = [p.policy_id for p in policies]
    daily_spent: Decimal | None = None
    for policy in policies:
        if tool in (policy.denied_tools or []) or tool_allowed(
            [t for t in (policy.denied_tools or []) if t.endswith("*")], tool
        ):
            return deny(exc.PolicyDenied(policy_id=policy.policy_id, rule="denied_tools", tool=tool), applied)
        if policy.allowed_tools is not None and not tool_allowed(list(policy.allowed_tools), tool):
            return deny(exc.PolicyDenied(policy_id=policy.policy_id, rule="allowed_tools", tool=tool), applied)
        if policy.max_credits_per_call is not None and price > policy.max_credits_per_call:
            return deny(
                exc.PolicyDenied(
                    policy_id=policy.policy_id,
                    rule="max_credits_per_call",
                    limit=money(policy.max_credits_per_call),
                    required=money(price),
                ),
                applied,
            )
        if policy.allowed_categories is not None and category not in policy.allowed_categories:
            return deny(
                exc.PolicyDenied(policy_id=policy.policy_id, rule="allowed_categories", category=category),
                applied,
            )
        if policy.max_daily_credits is not None:
            if daily_spent is None:
                daily_spent = wallet_spend(wallet, now=now).today
            if daily_spent + price > policy.max_daily_credits:
                return deny(
                    exc.PolicyDenied(
                        policy_id=policy.policy_id,
                        rule="max_daily_credits",
                        limit=money(policy.max_daily_credits),
                        spent=money(daily_spent),
                        required=money(price),
                    ),
                    applied,
                )
    return Decision(decision_id, True, None, applied)


# --- Permit requests and human approval ----------------------------------------------


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
    idempotency_scope: str,
    idempotency_key: str,
    request_hash: str,
) -> RequestCreate:
    """Record a pending request and notify the tenant's approvers after commit.

    Idempotent per (scope, key) like ``permit_issue``. Creating or listing
    requests never advances a decision.
    """
    existing = _created_before(PermitRequest, idempotency_scope, idempotency_key, request_hash)
    if existing is not None:
        return RequestCreate(permit_request=existing, replayed=True)
    _check_subject_key(wallet, subject_key_id)
    now = timezone.now()
    try:
        with transaction.atomic(durable=True):
            preq = PermitRequest.objects.create(
                request_id=new_id("preq"),
                tenant_id=wallet.tenant_id,
                wallet=wallet,
                requested_by_key_id=requested_by_key_id,
                allowed_tools=sorted(set(allowed_tools)),
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
            transaction.on_commit(lambda: permit_request_notify(request_id=request_id))
            audit_record(
                event="permit_request.created",
                ok=True,
                tenant_id=wallet.tenant_id,
                wallet_id=wallet.wallet_id,
                key_id=requested_by_key_id,
                endpoint="/v1/permit-requests",
                detail={"request_id": preq.request_id, "allowed_tools": preq.allowed_tools},
            )
    except IntegrityError:
        existing = _created_before(PermitRequest, idempotency_scope, idempotency_key, request_hash)
        if existing is None:
            raise
        return RequestCreate(permit_request=existing, replayed=True)
    return RequestCreate(permit_request=preq, replayed=False)


def approval_url(request_id: str) -> str:
    return f"{settings.PUBLIC_BASE_URL.rstrip('/')}/approvals/{request_id}"


def permit_request_notify(*, request_id: str) -> int:
    """Email the tenant's approvers the request card and a link to the approval page.

    Runs after the creating transaction commits. A delivery failure is logged and
    does not affect the request (approvers also see the queue page).
    """
    preq = PermitRequest.objects.select_related("wallet").get(request_id=request_id)
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
    text = (
        f"Permit request {preq.request_id} from wallet {preq.wallet_id}\n"
        f"Tools: {', '.join(preq.allowed_tools)}\nUp to {money(preq.max_credits)} credits\n"
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


@transaction.atomic(durable=True)
def permit_request_decide(*, request_id: str, user: Any, approve: bool, note: str = "") -> PermitRequest:
    """Approve (minting exactly one permit) or reject a pending request.

    Locks the request row, then re-checks: a decided request cannot be decided
    again (409), an expired one cannot be approved, and only approvers of the
    request's tenant may decide. Two concurrent approvals mint one permit.
    """
    preq = PermitRequest.objects.select_for_update(no_key=True).select_related("wallet").get(request_id=request_id)
    if not user_is_approver(user, preq.tenant_id):
        raise exc.NotAnApprover()
    now = timezone.now()
    if preq.status != PermitRequestStatus.PENDING:
        raise exc.RequestAlreadyDecided(request_id=request_id, status=preq.status)
    if preq.expires_at <= now:
        raise exc.RequestExpired(request_id=request_id)
    preq.decided_at = now
    preq.decided_by = user
    preq.decision_note = note[:500]
    if approve:
        tenant_root = Wallet.objects.get(wallet_id=preq.tenant_id)
        permit = _mint_permit(
            wallet=preq.wallet,
            issuer_wallet=tenant_root,
            issued_by_key_id="",
            allowed_tools=list(preq.allowed_tools),
            max_credits=preq.max_credits,
            max_calls=preq.max_calls,
            expires_at=now + timedelta(seconds=preq.permit_ttl_seconds),
            subject_key_id=preq.subject_key_id,
            via_request_id=preq.request_id,
        )
        preq.permit = permit
        preq.status = PermitRequestStatus.APPROVED
    else:
        preq.status = PermitRequestStatus.REJECTED
    preq.save(update_fields=["status", "decided_at", "decided_by", "decision_note", "permit"])
    audit_record(
        event="permit_request.approved" if approve else "permit_request.rejected",
        ok=True,
        tenant_id=preq.tenant_id,
        wallet_id=preq.wallet_id,
        endpoint=f"/approvals/{request_id}",
        detail={
            "request_id": request_id,
            "decided_by": user.get_username(),
            "permit_id": preq.permit_id,
        },
    )
    return preq


# --- Quotes --------------------------------------------------------------------------


@transaction.atomic(durable=True)
def quote_create(*, wallet: Wallet, tool: str, requested_by_key_id: str = "") -> Quote:
    """Freeze the tool's current price for one call by ``wallet`` in a signed quote.

    Quoting is free: no ledger entry, no reservation, no change to the wallet.
    A tool without a price cannot be quoted (422).
    """
    price = tool_price(tool)
    if price is None:
        raise RequestValidationError.single(
            ["body", "tool"], "This tool has no price set and cannot be quoted or called.", "tool_price_not_set"
        )
    now = timezone.now()
    quote = Quote(
        quote_id=new_id("qt"),
        tenant_id=wallet.tenant_id,
        wallet=wallet,
        tool=tool,
        quoted_credits=price,
        created_at=now,
        expires_at=now + QUOTE_LIFETIME,
        requested_by_key_id=requested_by_key_id,
    )
    signed = sign_statement(_quote_statement(quote))
    quote.signed_statement = signed.statement
    quote.signature = signed.signature
    quote.key_id = signed.kid
    quote.save(force_insert=True)
    audit_record(
        event="quote.created",
        ok=True,
        tenant_id=wallet.tenant_id,
        wallet_id=wallet.wallet_id,
        key_id=requested_by_key_id or None,
        tool=tool,
        endpoint="/v1/quotes",
        detail={"quote_id": quote.quote_id, "quoted_credits": money(price)},
    )
    return quote


def quote_check(*, quote: Quote | None, quote_id: str, wallet: Wallet, tool: str, now: datetime) -> Quote:
    """The quote a call may spend, checked without writing: the wallet's, for ``tool``, active, and signed.

    Raises ``QuoteUnavailable`` otherwise. The price charged comes from this row, so every column
    must be what was signed. Spending it is ``permits_quote_consume`` (``quote_consume``, or the
    governed call's claim), which re-checks all of it under the row lock.
    """
    if (
        quote is None
        or quote.wallet_id != wallet.wallet_id
        or quote.tool != tool
        or quote.effective_status(now) != QuoteStatus.ACTIVE
    ):
        raise exc.QuoteUnavailable(quote_id=quote_id)
    problem = quote_statement_problem(quote)
    if problem is not None:
        raise exc.QuoteUnavailable(quote_id=quote_id, reason="quote_signature_invalid", problem=problem)
    return quote


_QUOTE_CONSUME_SQL = "SELECT permits_quote_consume(%s, %s, %s, %s, %s, %s, %s)"  # permits/sql/permits_quote_consume.sql


def quote_consume(*, quote_id: str, wallet: Wallet, tool: str, action_id: str, now: datetime | None = None) -> Quote:
    """Spend an active quote exactly once. Caller holds the transaction.

    ``quote_check``, then ``permits_quote_consume``: a conditional UPDATE from ``active`` to
    ``consumed`` at the verified price, so of two concurrent calls with one quote, one succeeds
    and the other gets ``quote_unavailable``.
    """
    now = now or timezone.now()
    quote = quote_check(
        quote=Quote.objects.filter(quote_id=quote_id).first(), quote_id=quote_id, wallet=wallet, tool=tool, now=now
    )
    with connection.cursor() as cursor:
        cursor.execute(
            _QUOTE_CONSUME_SQL,
            [quote_id, wallet.wallet_id, tool, quote.quoted_credits, quote.signature, action_id, now],
        )
        consumed = bool(cursor.fetchone()[0])
    if not consumed:
        raise exc.QuoteUnavailable(quote_id=quote_id)
    quote.status, quote.consumed_at, quote.consumed_by = QuoteStatus.CONSUMED, now, action_id
    return quote


# --- Policy bundles ------------------------------------------------------------------

POLICY_FIELDS = (
    "name",
    "enabled",
    "allowed_tools",
    "denied_tools",
    "max_credits_per_call",
    "max_daily_credits",
    "allowed_categories",
    "human_approval_required",
)


def _policy_snapshot(policy: PolicyBundle) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in POLICY_FIELDS:
        value = getattr(policy, name)
        out[name] = money(value) if isinstance(value, Decimal) else value
    return out


@transaction.atomic(durable=True)
def policy_create(
    *, wallet: Wallet, actor_key_id: str = "", actor_wallet_id: str = "", actor: str = "", **rules: Any
) -> PolicyBundle:
    """Attach a policy bundle to ``wallet``; it applies to the wallet and every wallet below it.

    ``actor_wallet_id`` is the wallet of the creating key (empty for the operator): it
    records the level the policy was set at, which decides who may change it later
    (``permits.selectors.policy_for_change``).
    """
    policy = PolicyBundle(
        policy_id=new_id("pol"),
        tenant_id=wallet.tenant_id,
        wallet=wallet,
        created_by_key_id=actor_key_id,
        created_by_wallet_id=actor_wallet_id,
        **{k: v for k, v in rules.items() if k in POLICY_FIELDS},
    )
    policy.save(force_insert=True)
    audit_record(
        event="policy.created",
        ok=True,
        tenant_id=wallet.tenant_id,
        wallet_id=wallet.wallet_id,
        key_id=actor_key_id or None,
        endpoint="/v1/policies",
        detail={
            "policy_id": policy.policy_id,
            "rules": _policy_snapshot(policy),
            **({"actor": actor} if actor else {}),
        },
    )
    return policy


@transaction.atomic(durable=True)
def policy_update(*, policy_id: str, actor_key_id: str = "", actor: str = "", **changes: Any) -> PolicyBundle:
    """Change some rules of a policy bundle; bumps its version. Locks the row first."""
    policy = PolicyBundle.objects.select_for_update(no_key=True).get(policy_id=policy_id)
    before = _policy_snapshot(policy)
    fields = [k for k in changes if k in POLICY_FIELDS]
    for name in fields:
        setattr(policy, name, changes[name])
    policy.version += 1
    policy.save(update_fields=[*fields, "version", "updated_at"])
    audit_record(
        event="policy.updated",
        ok=True,
        tenant_id=policy.tenant_id,
        wallet_id=policy.wallet_id,
        key_id=actor_key_id or None,
        endpoint="/v1/policies/{policy_id}",
        detail={
            "policy_id": policy.policy_id,
            "before": before,
            "after": _policy_snapshot(policy),
            **({"actor": actor} if actor else {}),
        },
    )
    return policy


# --- Approvers --------------------------------------------------------------------------


@transaction.atomic(durable=True)
def tenant_approver_add(*, user: Any, tenant: Wallet, actor: str) -> TenantApprover:
    """Make ``user`` an approver of ``tenant``'s permit requests (the console), audited. Idempotent."""
    approver, created = TenantApprover.objects.get_or_create(user=user, tenant=tenant)
    if created:
        audit_record(
            event="approver.added",
            ok=True,
            tenant_id=tenant.tenant_id,
            wallet_id=tenant.wallet_id,
            detail={"user": user.get_username(), "actor": actor},
        )
    return approver


@transaction.atomic  # not durable: the console's delete view runs inside its own transaction
def tenant_approver_remove(*, approver: TenantApprover, actor: str) -> None:
    """Stop ``approver`` approving for its tenant (the console), audited."""
    tenant = approver.tenant
    username = approver.user.get_username()
    if TenantApprover.objects.filter(pk=approver.pk).delete()[0]:
        audit_record(
            event="approver.removed",
            ok=True,
            tenant_id=tenant.tenant_id,
            wallet_id=tenant.wallet_id,
            detail={"user": username, "actor": actor},
        )
