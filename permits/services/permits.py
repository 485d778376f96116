"""Permits: issuing (signed, once per idempotency key), revoking, the check of a permit's signed
statement at use, and the allowance reservation.

``permit_issue`` and ``permit_revoke`` own their transaction and write their audit event inside
it as the last statement. ``permit_reserve`` and ``permit_release`` are building blocks the gateway
runs in its own phase-1 transaction; they take no transaction of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeVar

from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from access.models import APIKey
from audit.signing import statement_problem
from billing.exceptions import money
from billing.models import Wallet
from common.canonical import iso_utc
from common.errors import IdempotencyKeyReused, RequestValidationError
from common.ids import new_id
from common.records import record_json
from permits import exceptions as exc
from permits.models import Permit, PermitRequest, PermitStatus
from permits.services.approval import approval_lock, human_approval_required, revoke_locked
from permits.services.approval_record import permit_approval_problem
from permits.services.rows import signed_row_fill, wallet_row_audit

M = TypeVar("M", Permit, PermitRequest)


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
        # The upstream servers it covers (null: any). Permits signed before it lack the key; their column is
        # null, which is what ``.get`` reads from their statements (as receipts' upstream_server_id).
        "allowed_servers": permit.allowed_servers,
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
    "allowed_servers",
    "max_credits",
    "max_calls",
    "expires_at",
)


def permit_reservation_record(*, permit: Permit, amount: Decimal, now: datetime) -> str:
    """A reservation of ``amount`` on ``permit`` as permits' reservation record (JSON text), what
    ``permits_reserve_in`` (permits/sql/permits_reserve.sql) takes from other apps' database functions:
    the permit, the amount, the time, and what the row must still carry after its signed statement
    verified (the signature, wallet, subject key, tools, allowance, call limit and expiry). The one
    constructor of the shape."""
    return record_json(
        {
            "permit_id": permit.permit_id,
            "amount": amount,
            "now": now,
            "signature": permit.signature,
            "wallet_id": permit.wallet_id,
            "subject_key_id": permit.subject_key_id,
            "allowed_tools": list(permit.allowed_tools),
            "max_credits": permit.max_credits,
            "max_calls": permit.max_calls,
            "expires_at": permit.expires_at,
        }
    )


def permit_statement_problem(permit: Permit) -> str | None:
    """Why ``permit``'s stored columns cannot be trusted, or None: the one check of a permit at use.

    Every column that authorization reads (``PERMIT_SIGNED_FIELDS``) must equal what
    was signed (``audit.signing.statement_problem``), and an approval the statement names must
    hold (``approval_record.permit_approval_problem``: ``approval_<why>``).
    """
    stored = _permit_statement(permit)
    return statement_problem(
        permit.signed_statement,
        permit.signature,
        expected_type="permit",
        columns={name: stored[name] for name in PERMIT_SIGNED_FIELDS},
    ) or permit_approval_problem(permit)


@dataclass(frozen=True)
class PermitIssue:
    """The outcome of ``permit_issue``: the permit and whether this was a replay."""

    permit: Permit
    replayed: bool


@dataclass(frozen=True)
class PermitTerms:
    """What a permit grants, to whom and from whom: the terms ``permit_issue`` and an approved request mint
    and sign. ``issuer_wallet`` None: the operator (or the gateway, for an approved request);
    ``issued_by_key_id``: the issuing key, empty for the operator; ``allowed_servers`` None: any server."""

    wallet: Wallet
    issuer_wallet: Wallet | None
    allowed_tools: list[str]
    max_credits: Decimal
    max_calls: int | None
    expires_at: datetime
    subject_key_id: str | None = None
    allowed_servers: list[str] | None = None
    issued_by_key_id: str = ""


def _mint_permit(
    *,
    terms: PermitTerms,
    idempotency_scope: str = "",
    idempotency_key: str = "",
    request_hash: str = "",
    via_request_id: str = "",
    approval: Callable[[dict[str, Any]], Mapping[str, Any]] | None = None,
    now: datetime | None = None,
) -> Permit:
    """Create and sign a permit. Caller holds the transaction.

    ``approval``: for a permit a person approved, called with the statement about to be signed (the
    terms) before it is signed; it signs the approval of exactly those terms and returns the
    reference the permit's statement then carries as ``approval``. Without it the statement has no
    ``approval`` member (as every permit signed before approvals were signed).
    """
    now = now or timezone.now()
    permit = Permit(
        permit_id=new_id("pmt"),
        tenant_id=terms.wallet.tenant_id,
        wallet=terms.wallet,
        issuer_wallet=terms.issuer_wallet,
        issued_by_key_id=terms.issued_by_key_id,
        issued_via_request_id=via_request_id,
        subject_key_id=terms.subject_key_id,
        allowed_tools=sorted(set(terms.allowed_tools)),
        allowed_servers=sorted(set(terms.allowed_servers)) if terms.allowed_servers is not None else None,
        max_credits=terms.max_credits,
        max_calls=terms.max_calls,
        expires_at=terms.expires_at,
        created_at=now,
        idempotency_scope=idempotency_scope,
        idempotency_key=idempotency_key,
        request_hash=request_hash,
    )
    statement = _permit_statement(permit)
    if approval is not None:
        statement["approval"] = dict(approval(statement))
    signed_row_fill(permit, statement)
    permit.save(force_insert=True)
    return permit


def _check_subject_key(wallet: Wallet, subject_key_id: str | None) -> None:
    """A permit (or a request for one) may bind only an active key of its own subject wallet."""
    if subject_key_id is None:
        return
    if not APIKey.objects.filter(key_id=subject_key_id, wallet_id=wallet.wallet_id, status="active").exists():
        raise RequestValidationError.single(
            ["body", "subject_key_id"], "Not an active API key of the subject wallet.", "value_error"
        )


def permit_issue(*, terms: PermitTerms, idempotency_scope: str, idempotency_key: str, request_hash: str) -> PermitIssue:
    """Issue a signed permit once per (scope, idempotency key).

    The same key with the same request returns the permit issued first
    (``replayed``); with a different request it is the idempotency conflict.
    The issuer must be the subject wallet or above it (the caller checks reach;
    this re-checks the hierarchy). Operator keys issue with no issuer wallet. The terms' ``allowed_servers``
    (the upstream servers whose tools it covers) are signed with the rest.
    """
    wallet, issuer_wallet, issued_by_key_id = terms.wallet, terms.issuer_wallet, terms.issued_by_key_id
    existing = _created_before(Permit, idempotency_scope, idempotency_key, request_hash)
    if existing is not None:
        return PermitIssue(permit=existing, replayed=True)
    if issuer_wallet is not None and issuer_wallet.wallet_id not in wallet.ancestry:
        raise exc.IssuerNotAllowed()
    try:
        with transaction.atomic(durable=True):
            if issuer_wallet is not None:
                # Under the tenant's approval lock: a policy that starts requiring approval while this
                # permit is minted either commits first (refused here) or revokes it after.
                approval_lock(wallet.tenant_id, shared=True)
                if human_approval_required(wallet):
                    raise exc.HumanApprovalRequired(wallet_id=wallet.wallet_id)
            _check_subject_key(wallet, terms.subject_key_id)
            permit = _mint_permit(
                terms=terms,
                idempotency_scope=idempotency_scope,
                idempotency_key=idempotency_key,
                request_hash=request_hash,
            )
            wallet_row_audit(
                "permit.issued",
                wallet,
                key_id=issued_by_key_id or None,
                endpoint="/v1/permits",
                detail={
                    "permit_id": permit.permit_id,
                    "allowed_tools": permit.allowed_tools,
                    **({"allowed_servers": permit.allowed_servers} if permit.allowed_servers is not None else {}),
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
    if permit.status != PermitStatus.REVOKED:
        revoke_locked(
            permit, reason=reason, endpoint="/v1/permits/{permit_id}/revoke", actor_key_id=actor_key_id, actor=actor
        )
    return permit


_RESERVE_SQL = "SELECT permits_reserve(%s, %s, %s, %s)"  # permits/sql/permits_reserve.sql


def permit_reserve(*, permit: Permit, amount: Decimal, now: datetime | None = None) -> None:
    """Reserve ``amount`` and one call against the permit's allowance. Caller holds the transaction.

    The database function ``permits_reserve`` (one conditional UPDATE): it succeeds
    only while the permit is active, unexpired, and the allowance (credits and calls)
    covers the reservation, so concurrent reservations can never spend past
    ``max_credits``. Raises the reason when it fails (``permit_reserve_refusal``).
    """
    now = now or timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(_RESERVE_SQL, [permit.tenant_id, permit.permit_id, amount, now])
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
