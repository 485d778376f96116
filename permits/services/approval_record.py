"""Approvals in the signed record: a person's decision on a permit request as a signed statement
(type ``permit_approval``), the reference a permit's statement carries to it, and the one check that
a permit is approved (docs/decisions.md, Authority, "Approvals are signed"; docs/audit-chain.md,
"Approvals").

Which permits a person approved is read from the permit's signed statement (its ``approval``
member) and the approval's own signed statement, never from a column: a writer of the permits
tables cannot make a permit look approved without the signing key.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from audit.evidence_core import APPROVAL_TYPE, approval_link_problem, permit_terms_digest
from audit.signing import statement_problem, verify_statement
from common.canonical import iso_utc, sha256_hex
from common.ids import new_id
from permits.models import Permit, PermitApproval, PermitApprovalDecision, PermitRequest
from permits.services.rows import signed_row_fill


def _approval_statement(approval: PermitApproval) -> dict[str, Any]:
    return {
        "type": APPROVAL_TYPE,
        "approval_id": approval.approval_id,
        "request_id": approval.permit_request_id,
        "tenant_id": approval.tenant_id,
        "wallet_id": approval.wallet_id,
        "decision": approval.decision,
        "approver_user_id": approval.approver_user_id,
        "approver": approval.approver,
        "decided_at": iso_utc(approval.decided_at),
        "permit_id": approval.permit_id,
        "terms_digest": approval.terms_digest,
    }


def approval_record_sign(
    *, preq: PermitRequest, user: Any, decided_at: datetime, permit_terms: Mapping[str, Any] | None
) -> tuple[PermitApproval, str]:
    """Sign and store the decision on ``preq`` by ``user`` at ``decided_at``; returns the row and the
    SHA-256 of its signed canonical bytes (for the decision's audit event).

    ``permit_terms``: for an approval, the statement the permit is about to be signed with (without
    ``kid`` and ``approval``): the approval names that permit and signs the digest of those terms;
    None for a rejection. Caller holds the transaction and the request's row lock.
    """
    approval = PermitApproval(
        approval_id=new_id("apv"),
        tenant_id=preq.tenant_id,
        permit_request=preq,
        wallet_id=preq.wallet_id,
        decision=PermitApprovalDecision.APPROVED if permit_terms is not None else PermitApprovalDecision.REJECTED,
        approver_user_id=user.pk,
        approver=user.get_username(),
        decided_at=decided_at,
        permit_id=None if permit_terms is None else str(permit_terms["permit_id"]),
        terms_digest=None if permit_terms is None else permit_terms_digest(permit_terms),
    )
    signed = signed_row_fill(approval, _approval_statement(approval))
    approval.save(force_insert=True)
    return approval, sha256_hex(signed.canonical)


def approval_reference(approval: PermitApproval) -> dict[str, Any]:
    """What a permit's statement says of the approval it was minted under (``approval``), each
    field as the approval signed it (``audit.evidence_core.APPROVAL_REFERENCE_FIELDS``)."""
    statement = approval.signed_statement
    return {name: statement[name] for name in ("approval_id", "request_id", "approver", "decided_at", "terms_digest")}


def permit_approval_of(permit: Permit) -> PermitApproval | None:
    """The stored approval ``permit``'s statement names (in the permit's tenant), or None."""
    reference = permit.signed_statement.get("approval") if isinstance(permit.signed_statement, dict) else None
    if not isinstance(reference, Mapping) or not isinstance(reference.get("approval_id"), str):
        return None
    return PermitApproval.objects.filter(approval_id=reference["approval_id"], tenant_id=permit.tenant_id).first()


def approval_statement_problem(approval: PermitApproval) -> str | None:
    """Why ``approval``'s row cannot be trusted, or None: its signature verifies over its statement
    and every column equals what was signed."""
    stored = _approval_statement(approval)
    return statement_problem(
        approval.signed_statement,
        approval.signature,
        expected_type=APPROVAL_TYPE,
        columns={name: value for name, value in stored.items() if name != "type"},
    )


def permit_approval_problem(permit: Permit) -> str | None:
    """Why the approval ``permit``'s statement names does not hold, or None (also None when it names
    none). Assumes the permit's own signature was checked. The named approval must be stored in the
    permit's tenant, validly signed, and match the permit (``audit.evidence_core.approval_link_problem``:
    approved, this permit, tenant and wallet, the same approver and time, the digest of its terms).
    """
    if not isinstance(permit.signed_statement, dict) or permit.signed_statement.get("approval") is None:
        return None
    approval = permit_approval_of(permit)
    if approval is None:
        return "approval_missing"
    problem = approval_statement_problem(approval)
    if problem is not None:
        return f"approval_{problem}"
    return approval_link_problem(permit.signed_statement, approval.signed_statement)


def permit_signed_approval(permit: Permit) -> dict[str, Any] | None:
    """The ``approval`` member of ``permit``'s statement when the statement's signature verifies, else
    None. What listings show as "approved" (the approval row itself is checked at use and in the
    evidence: ``permit_approval_problem``)."""
    statement = permit.signed_statement
    if not isinstance(statement, dict) or not isinstance(statement.get("approval"), dict):
        return None
    if not verify_statement(statement, permit.signature, expected_type="permit").valid:
        return None
    return dict(statement["approval"])


def permit_approval_standing(permit: Permit) -> str:
    """Who stands behind ``permit`` by its signed record: ``operator`` (no issuer wallet), ``approved``
    (a person's approval that holds) or ``unapproved`` (a wallet's key, an approval that does not hold,
    or a statement whose signature does not verify). ``issued_via_request_id`` is never read."""
    statement = permit.signed_statement
    if not isinstance(statement, dict) or not verify_statement(statement, permit.signature, expected_type="permit"):
        return "unapproved"
    if statement.get("approval") is not None:
        return "approved" if permit_approval_problem(permit) is None else "unapproved"
    return "operator" if statement.get("issuer_wallet_id") is None else "unapproved"
