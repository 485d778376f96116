"""Receipt reads: scoped listings, evidence bundles (checks computed now) and portable exports."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import QuerySet

from access.selectors import Principal
from audit.chain_verification import audit_chain_verify
from audit.evidence_core import CHAIN_ROW_FIELDS
from audit.models import AuditEvent, SigningKey
from audit.signing import verify_statement
from billing.models import LedgerKind
from billing.selectors import scope_to_caller
from common.canonical import (
    MAX_SAFE_INTEGER,
    CanonicalizationError,
    b64url_encode,
    canonical_bytes,
    canonical_bytes_fast,
    sha256_hex,
)
from common.errors import NotFound
from permits.models import PermitApproval
from permits.services import permit_approval_of, permit_approval_problem, permit_statement_problem
from receipts.models import Receipt, RefundReconciliation
from receipts.services import SIGNATURE_STATEMENT, receipt_statement_problem
from receipts.verify import FORMAT
from tlog.selectors import statement_transparency


def receipts_visible(principal: Principal) -> QuerySet[Receipt]:
    """Operators see every receipt; wallet keys their wallet's and its descendants'."""
    return scope_to_caller(Receipt.objects.all(), principal)


def receipt_list(principal: Principal, filters: dict[str, Any]) -> QuerySet[Receipt]:
    qs = receipts_visible(principal)
    for name in ("permit_id", "wallet_id", "tool", "outcome"):
        if filters.get(name):
            qs = qs.filter(**{name: filters[name]})
    return qs.order_by("-created_at", "receipt_id")


def receipt_for_caller(principal: Principal, receipt_id: str) -> Receipt:
    receipt = receipts_visible(principal).select_related("permit", "ledger_entry").filter(receipt_id=receipt_id).first()
    if receipt is None:
        raise NotFound("No such receipt.", receipt_id=receipt_id)
    return receipt


def reconciliation_visible(principal: Principal) -> QuerySet[RefundReconciliation]:
    return scope_to_caller(
        RefundReconciliation.objects.select_related("receipt"), principal, wallet_path="receipt__wallet__path"
    )


def _as_sent(value: Any) -> Any:
    """``value`` with every integer beyond ±(2**53 - 1) turned back into the float it was sent as.

    The stored request document is ``jsonb``, which keeps numbers as decimals and gives an integral
    one back as an integer: a float argument of 2**53 or more (``1e20``) reads back as the integer
    ``10**20``, outside RFC 8785's domain. The edge refuses such integers (``common.jsonbody``), so
    one read back was a float; ``jsonb`` kept its shortest round-trip digits, which convert back to
    exactly that float, whose canonical text is what was hashed at call time.
    """
    if type(value) is int and abs(value) > MAX_SAFE_INTEGER:  # not a bool
        return float(value)
    if isinstance(value, dict):
        return {key: _as_sent(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_sent(item) for item in value]
    return value


def request_document_hash(document: Any) -> str:
    """The request hash: SHA-256 of the canonical JSON of ``{"tool", "arguments"}``.

    Also reads a stored document back: a large float that came back as an integer is hashed as the
    float it was (see ``_as_sent``). Raises ``ValueError`` (or ``OverflowError``) for a document RFC 8785
    cannot encode.
    """
    try:
        return sha256_hex(canonical_bytes_fast(document))
    except CanonicalizationError:
        return sha256_hex(canonical_bytes_fast(_as_sent(document)))


def _signature_check(statement: Any, signature: str, expected_type: str) -> str:
    result = verify_statement(statement, signature, expected_type=expected_type)
    return "ok" if result.valid else (result.reason or "invalid")


def ledger_entries_problem(receipt: Receipt) -> str | None:
    """Why a ledger entry the receipt names (its signed ``ledger_entry_id`` and ``refund_entry_id``) disagrees
    with what the receipt signed, or None.

    The charge is the wallet's debit of the price authorized; the refund gives back what was not
    charged. Both are the receipt's wallet's. An entry edited after the fact (another amount, wallet or
    kind) is served beside the receipt, so it must not pass as verified evidence.
    """
    expected = (
        ("ledger_entry", receipt.ledger_entry, LedgerKind.CHARGE, -receipt.credits_authorized),
        ("refund_entry", receipt.refund_entry, LedgerKind.REFUND, receipt.credits_authorized - receipt.credits_charged),
    )
    for name, entry, kind, amount in expected:
        if entry is not None and (entry.wallet_id, entry.kind, entry.amount) != (receipt.wallet_id, kind, amount):
            return f"{name}_mismatch"
    return None


def verification_map(receipt: Receipt, audit_event: AuditEvent | None) -> dict[str, str]:
    """Each check recomputed now: ``ok``, ``skipped`` or the failure reason."""
    checks: dict[str, str] = {}
    receipt_check = _signature_check(receipt.signed_statement, receipt.signature, "receipt")
    if receipt_check == "ok":
        # The columns and the ledger entries served beside the statement must say what was signed.
        receipt_check = receipt_statement_problem(receipt) or ledger_entries_problem(receipt) or "ok"
    checks["receipt_signature"] = receipt_check
    if receipt.permit is None:
        checks["permit_signature"] = "skipped"
    else:
        # The signature over the statement and every column authorization reads (permits.services.permits).
        checks["permit_signature"] = permit_statement_problem(receipt.permit) or "ok"
    if receipt.permit is None or receipt.permit.signed_statement.get("approval") is None:
        checks["permit_approval"] = "skipped"
    else:
        # The approval the permit's statement names: stored, validly signed, and of exactly its terms.
        checks["permit_approval"] = permit_approval_problem(receipt.permit) or "ok"
    if audit_event is None:
        checks["audit_chain"] = "missing_event"
    else:
        # Anchored: the walk goes on from the event to the chain's head (see audit_chain_verify), so
        # an event rewritten with its own hash recomputed is caught at the link above it.
        result = audit_chain_verify(chain=audit_event.chain, to_seq=audit_event.seq)
        if not result.valid:
            checks["audit_chain"] = f"broken_at_seq_{result.first_broken_seq}:{result.reason}"
        elif audit_event.detail.get("receipt_id") != receipt.receipt_id:
            checks["audit_chain"] = "event_not_linked"
        else:
            checks["audit_chain"] = "ok"
    try:
        recomputed = request_document_hash(receipt.request_document)
    except (OverflowError, RecursionError, TypeError, ValueError):  # a stored document no honest call could have left
        checks["request_hash"] = "not_canonicalizable"
    else:
        checks["request_hash"] = (
            "ok" if recomputed == receipt.request_hash == receipt.signed_statement.get("request_hash") else "mismatch"
        )
    return checks


def receipt_audit_event(receipt: Receipt) -> AuditEvent | None:
    return AuditEvent.objects.filter(event_id=receipt.audit_event_id).first()


def _portable_approval(receipt: Receipt) -> dict[str, Any]:
    """``permit`` and ``approval`` (signed bytes and signature each) when the receipt's permit names an
    approval, for the offline verifiers to check the one against the other; else nothing. A named
    approval that is not stored leaves the permit alone, which the verifiers refuse (approval_missing)."""
    permit = receipt.permit
    if permit is None or permit.signed_statement.get("approval") is None:
        return {}
    out = {
        "permit": {
            "signed_bytes": b64url_encode(canonical_bytes(permit.signed_statement)),
            "signature": permit.signature,
        }
    }
    approval = permit_approval_of(permit)
    if approval is not None:
        out["approval"] = {
            "signed_bytes": b64url_encode(canonical_bytes(approval.signed_statement)),
            "signature": approval.signature,
        }
    return out


def portable_receipt(receipt: Receipt) -> dict[str, Any]:
    """The receipt as exactly signed, its signature and kid, and a snapshot of the published keys."""
    keys = [
        {"kty": "OKP", "crv": "Ed25519", "x": public, "kid": kid, "use": "sig", "alg": "EdDSA", "status": state}
        for kid, public, state in SigningKey.objects.order_by("created_at").values_list("key_id", "public_key", "state")
    ]
    signed = canonical_bytes(receipt.signed_statement)
    document = {
        **_portable_approval(receipt),
        "format": FORMAT,
        "receipt_id": receipt.receipt_id,
        "kid": receipt.key_id,
        "alg": "EdDSA",
        "signed_bytes": b64url_encode(signed),
        "signed_bytes_sha256": sha256_hex(signed),
        "signature": receipt.signature,
        "receipt": receipt.signed_statement,
        "keys": {"keys": keys},
        "what_a_valid_signature_proves": SIGNATURE_STATEMENT,
        "verify_with": "python -m receipts.verify PORTABLE.json [--keys JWKS.json] [--policy POLICY.json]",
    }
    # Unsigned: the receipt's place in its tenant's transparency log (docs/audit-chain.md).
    transparency = statement_transparency(receipt.tenant_id, receipt.receipt_id)
    if transparency is not None:
        document["transparency"] = transparency
    return document


CLAIM_BOUNDARY = (
    "The gateway is a durable state machine, not one distributed ACID transaction and not proof of the "
    "downstream effect. A remote side effect happens exactly once only when the upstream honors the "
    "forwarded idempotency key. Authoritative external reconciliation is required after the loop."
)


def _ledger_data(entry: Any) -> dict[str, Any] | None:
    if entry is None:
        return None
    return {
        "entry_id": entry.entry_id,
        "transaction_id": entry.transaction_id,
        "wallet_id": entry.wallet_id,
        "kind": entry.kind,
        "amount": entry.amount,
        "balance_after": entry.balance_after,
        "service_category": entry.service_category,
        "description": entry.description,
        "correlation_id": entry.correlation_id,
        "created_at": entry.created_at,
    }


# The audit event as the evidence carries it: its id and chain, then the fields its chain hash covers
# (``CHAIN_ROW_FIELDS``, in their order) but the tenant's id, which the chain names.
EVENT_FIELDS = ("event_id", "chain", *(name for name in CHAIN_ROW_FIELDS if name not in ("event_id", "tenant_id")))


def _event_data(event: AuditEvent | None) -> dict[str, Any] | None:
    if event is None:
        return None
    return {name: getattr(event, name) for name in EVENT_FIELDS}


def _signed_row(row: Any, id_field: str) -> dict[str, Any]:
    """A signed row as the evidence carries it: its id, signed statement, signature and kid."""
    return {
        id_field: getattr(row, id_field),
        "signed_statement": row.signed_statement,
        "signature": row.signature,
        "key_id": row.key_id,
    }


def _approval_row(approval: PermitApproval) -> dict[str, Any]:
    """The approval as the evidence carries it: its signed row and, unsigned, its place in the tenant's
    transparency log (an approval decision is a leaf like every statement; docs/audit-chain.md, "Approvals")."""
    return {
        **_signed_row(approval, "approval_id"),
        "transparency": statement_transparency(approval.tenant_id, approval.approval_id),
    }


def evidence_bundle(receipt: Receipt) -> dict[str, Any]:
    """Receipt, permit, ledger entries, audit event and the verification map computed now."""
    event = receipt_audit_event(receipt)
    checks = verification_map(receipt, event)
    permit = receipt.permit
    approval = permit_approval_of(permit) if permit is not None else None
    return {
        "receipt": receipt,
        "approval": None if approval is None else _approval_row(approval),
        "permit": None if permit is None else _signed_row(permit, "permit_id"),
        "ledger_entry": _ledger_data(receipt.ledger_entry),
        "refund_ledger_entry": _ledger_data(receipt.refund_entry),
        "audit_event": _event_data(event),
        "verification": checks,
        "verified": all(v in ("ok", "skipped") for v in checks.values()),
        "transparency": statement_transparency(receipt.tenant_id, receipt.receipt_id),
        "claim_boundary": CLAIM_BOUNDARY,
    }


def console_figures(user: Any, now: datetime) -> dict[str, Any]:
    """The console index's receipts figure: open reconciliation items (``view_refundreconciliation``)."""
    if not user.has_perm("receipts.view_refundreconciliation"):
        return {}
    return {"open_reconciliation": RefundReconciliation.objects.filter(status="pending").count()}
