"""Receipt writes: issuing signed receipts and posting owed refunds through reconciliation items."""

from __future__ import annotations

import logging
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.services import PreparedEvent, audit_append_prepared, audit_event_prepare, audit_record
from audit.signing import sign_statement, statement_problem
from billing.exceptions import money
from billing.models import LedgerEntry, Wallet
from billing.services import ledger_refund
from common import fastsql
from common.canonical import iso_utc
from common.errors import ApplicationError, Conflict, NotFound
from common.ids import new_id
from permits.models import Permit
from permits.services import permit_release
from receipts.models import (
    Outcome,
    Receipt,
    ReconciliationResult,
    ReconciliationStatus,
    ReconciliationVerdict,
    RefundReconciliation,
)

logger = logging.getLogger("tollgate.receipts")

# What a valid receipt signature proves, carried in every portable export (spec point 14).
SIGNATURE_STATEMENT = (
    "A valid signature proves only that this receipt matches the supplied public key snapshot. "
    "The snapshot must be authenticated through a trusted channel (for example the issuer's "
    "/.well-known/jwks.json fetched over TLS, or a key pinned out of band) for issuer identity "
    "to hold. A receipt is evidence of the gateway's record of the action, not proof of the "
    "downstream effect: reconcile authoritatively with the upstream system."
)


def receipt_statement(receipt: Receipt) -> dict[str, Any]:
    """The statement a receipt signs (everything that identifies and links the action's outcome)."""
    return {
        "type": "receipt",
        "receipt_id": receipt.receipt_id,
        "tenant_id": receipt.tenant_id,
        "action_id": receipt.action_id,
        "wallet_id": receipt.wallet_id,
        "permit_id": receipt.permit_id,
        "api_key_id": receipt.api_key_id,
        "tool": receipt.tool,
        "outcome": receipt.outcome,
        "reason_code": receipt.reason_code,
        "request_hash": receipt.request_hash,
        "response_hash": receipt.response_hash,
        "credits_authorized": money(receipt.credits_authorized),
        "credits_charged": money(receipt.credits_charged),
        "ledger_entry_id": receipt.ledger_entry_id,
        "refund_entry_id": receipt.refund_entry_id,
        "quote_id": receipt.quote_id or None,
        "audit_event_id": receipt.audit_event_id,
        "policy_decision_id": receipt.policy_decision_id or None,
        # Where the call went (docs/audit-chain.md): the server's id and the URL it was sent to, null
        # for a local tool or a refused call. Receipts signed before these were signed lack them;
        # their columns are null, which is what ``.get`` reads from their statements.
        "upstream_server_id": receipt.upstream_server_id,
        "upstream_url": receipt.upstream_url,
        "created_at": iso_utc(receipt.created_at),
    }


def receipt_statement_problem(receipt: Receipt) -> str | None:
    """Why ``receipt``'s stored columns disagree with its signed statement, or None.

    Evidence and every decision taken from a receipt (refund reconciliation: its
    wallet, charge, permit and amounts) read the columns; a column edited after
    signing must not be trusted. Checks the signature, then each signed field.
    """
    return statement_problem(
        receipt.signed_statement, receipt.signature, expected_type="receipt", columns=receipt_statement(receipt)
    )


def receipt_prepare(
    *,
    action_id: str,
    wallet: Wallet,
    api_key_id: str,
    tool: str,
    outcome: str,
    request_document: dict[str, Any],
    request_hash: str,
    credits_authorized: Decimal,
    credits_charged: Decimal,
    response_hash: str = "",
    reason_code: str = "",
    permit: Permit | None = None,
    ledger_entry: LedgerEntry | None = None,
    refund_entry: LedgerEntry | None = None,
    quote_id: str = "",
    policy_decision_id: str = "",
    upstream_server_id: str | None = None,
    upstream_url: str | None = None,
    endpoint: str = "",
    audit_detail: dict[str, Any] | None = None,
) -> tuple[Receipt, PreparedEvent]:
    """The signed receipt of one action and its audit event, ready to write (nothing written yet).

    The receipt's signed statement names the audit event's id and the audit
    event names the receipt, so each links to the other. ``receipt_issue``
    writes them; the governed call's ``gateway_finish`` writes them in its own
    round trip.
    """
    if outcome not in Outcome.values:
        raise ValueError(f"unknown receipt outcome {outcome!r}")
    receipt = Receipt(
        receipt_id=new_id("rcpt"),
        tenant_id=wallet.tenant_id,
        action_id=action_id,
        wallet=wallet,
        permit=permit,
        api_key_id=api_key_id,
        tool=tool,
        outcome=outcome,
        reason_code=reason_code,
        request_hash=request_hash,
        request_document=request_document,
        response_hash=response_hash,
        credits_authorized=credits_authorized,
        credits_charged=credits_charged,
        ledger_entry=ledger_entry,
        refund_entry=refund_entry,
        quote_id=quote_id,
        audit_event_id=new_id("evt"),
        policy_decision_id=policy_decision_id,
        upstream_server_id=upstream_server_id,
        upstream_url=upstream_url,
        created_at=timezone.now(),
    )
    signed = sign_statement(receipt_statement(receipt))
    receipt.signed_statement = signed.statement
    receipt.signature = signed.signature
    receipt.key_id = signed.kid
    event = audit_event_prepare(
        event_id=receipt.audit_event_id,
        event=f"tool_call.{outcome}",
        ok=outcome == Outcome.SUCCESS,
        tenant_id=wallet.tenant_id,
        wallet_id=wallet.wallet_id,
        key_id=api_key_id,
        tool=tool,
        endpoint=endpoint or None,
        policy_decision_id=policy_decision_id or None,
        detail={
            "receipt_id": receipt.receipt_id,
            "action_id": action_id,
            "outcome": outcome,
            "reason_code": reason_code,
            "ledger_entry_id": receipt.ledger_entry_id,
            "credits_charged": money(credits_charged),
            **({"upstream_server_id": upstream_server_id, "upstream_url": upstream_url} if upstream_url else {}),
            **(audit_detail or {}),
        },
    )
    return receipt, event


def receipt_issue(**kwargs: Any) -> Receipt:
    """Sign and store the receipt of one action and append its audit event. Caller holds the transaction.

    Arguments as ``receipt_prepare``. The audit append is the last statement (it locks
    the tenant's chain head until commit).
    """
    receipt, event = receipt_prepare(**kwargs)
    fastsql.insert(receipt)  # receipts are only ever inserted (``Receipt.save`` refuses updates)
    audit_append_prepared(event)
    return receipt


# --- Refund reconciliation -----------------------------------------------------------


def refund_reconciliation_open(
    *, receipt: Receipt, amount: Decimal, origin: str, reason: str = ""
) -> RefundReconciliation:
    """Record that ``amount`` is owed back for ``receipt``. Caller holds the transaction.

    At most one item per receipt: opening an existing one returns it unchanged.
    """
    item, _ = RefundReconciliation.objects.get_or_create(
        receipt=receipt,
        defaults={"tenant_id": receipt.tenant_id, "amount": amount, "origin": origin, "reason": reason[:500]},
    )
    return item


class RefundNotOwed(Conflict):
    code = "refund_not_owed"
    message = "No refund is owed for this receipt."


class ReconciliationDecided(Conflict):
    code = "reconciliation_decided"
    message = "This call was already reconciled the other way; nothing was changed."


def _record_result(receipt: Receipt, verdict: str, *, actor: str, note: str) -> bool:
    """Record ``verdict`` for ``receipt`` (locked by the caller): True when it is new, False when the same
    result was recorded before. Refuses (409) the opposite of a recorded result."""
    existing = ReconciliationResult.objects.filter(receipt=receipt).first()
    if existing is not None:
        if existing.verdict != verdict:
            raise ReconciliationDecided(
                receipt_id=receipt.receipt_id,
                recorded=existing.verdict,
                recorded_by=existing.actor,
                recorded_at=existing.created_at.isoformat(),
            )
        return False
    ReconciliationResult.objects.create(
        receipt=receipt, tenant_id=receipt.tenant_id, verdict=verdict, actor=actor[:100], note=note[:500]
    )
    return True


@transaction.atomic(durable=True)
def refund_reconciliation_mark_not_executed(*, receipt_id: str, actor: str, note: str = "") -> RefundReconciliation:
    """Operator's external reconciliation result for a ``delivery_uncertain`` call: it did not run.

    Opens a pending refund item for the kept charge (post it with a retry). One result per receipt
    (``ReconciliationResult``): marking it again returns the same item; after "executed" it is
    refused (409 ``reconciliation_decided``).
    """
    receipt = Receipt.objects.select_for_update(no_key=True).get(receipt_id=receipt_id)
    _require_signed_columns(receipt)
    if receipt.outcome != Outcome.DELIVERY_UNCERTAIN:
        raise RefundNotOwed("Only a delivery_uncertain receipt can be marked not executed.", receipt_id=receipt_id)
    if receipt.credits_charged <= 0:
        raise RefundNotOwed(receipt_id=receipt_id)
    if not _record_result(receipt, ReconciliationVerdict.NOT_EXECUTED, actor=actor, note=note):
        return RefundReconciliation.objects.get(receipt=receipt)
    item = refund_reconciliation_open(
        receipt=receipt,
        amount=receipt.credits_charged,
        origin="operator_not_executed",
        # Who marked it is in the reconciliation result and the audit event, for operators; the item is
        # listed to the wallet's keys too, which learn no console username from it.
        reason=f"marked not executed: {note}" if note else "marked not executed",
    )
    _reconciliation_audit(receipt, "marked_not_executed", actor=actor, amount=money(item.amount))
    return item


class ReceiptTampered(Conflict):
    code = "receipt_statement_mismatch"
    message = "The receipt's stored columns disagree with its signed statement; nothing was done."


def _require_signed_columns(receipt: Receipt, *, amount: Decimal | None = None) -> None:
    """Refuse (409) to act on a receipt whose columns were changed after signing, or to refund above its charge."""
    problem = receipt_statement_problem(receipt)
    if problem is not None:
        raise ReceiptTampered(receipt_id=receipt.receipt_id, problem=problem)
    if amount is not None and amount > receipt.credits_charged:
        raise ReceiptTampered(
            "The reconciliation amount is above what the signed receipt charged; nothing was done.",
            receipt_id=receipt.receipt_id,
            problem="amount_above_charge",
        )


def refund_reconciliation_retry(*, receipt_id: str, actor: str = "") -> RefundReconciliation:
    """Post the owed refund at most once, however many times or concurrently this is called.

    Locks the item row, then re-checks: a resolved item is returned unchanged.
    The refund, the permit allowance release, the link and the audit event
    commit together. When the refund cannot be posted yet (for example the
    wallet is closed), the item stays pending with the reason and attempt count.
    """
    with transaction.atomic(durable=True):
        item = (
            RefundReconciliation.objects.select_for_update(no_key=True, of=("self",))
            .select_related("receipt")
            .filter(receipt_id=receipt_id)
            .first()
        )
        if item is None:
            raise NotFound("No refund reconciliation item for this receipt.", receipt_id=receipt_id)
        if item.status == ReconciliationStatus.RESOLVED:
            return item
        receipt = item.receipt
        _require_signed_columns(receipt, amount=item.amount)
        charge = receipt.ledger_entry
        try:
            with transaction.atomic():  # savepoint: a failed refund leaves the attempt recorded
                # Lock order as in the governed call: the wallet row (and its agent ancestors, taken
                # first by the refund), then the permit row.
                refund = ledger_refund(
                    amount=item.amount,
                    charge=charge,
                    wallet=None if charge is not None else receipt.wallet_id,
                    description=f"refund for {receipt.receipt_id}",
                    correlation_id=receipt.action_id,
                )
                if receipt.permit_id:
                    permit_release(permit_id=receipt.permit_id, amount=item.amount)
        except ApplicationError as err:
            item.attempts += 1
            item.last_error = err.detail_message[:500]
            item.save(update_fields=["attempts", "last_error", "updated_at"])
            _reconciliation_audit(receipt, "refund_failed", ok=False, error=err.code, actor=actor)
            return item
        now = timezone.now()
        item.status = ReconciliationStatus.RESOLVED
        item.refund_entry = refund
        item.resolved_at = now
        item.resolved_by = actor[:100]
        item.attempts += 1
        item.last_error = ""
        item.save(
            update_fields=[
                "status",
                "refund_entry",
                "resolved_at",
                "resolved_by",
                "attempts",
                "last_error",
                "updated_at",
            ]
        )
        _reconciliation_audit(
            receipt,
            "refund_posted",
            endpoint="/v1/receipts/reconciliation/refunds/{receipt_id}/retry",
            refund_entry_id=refund.entry_id,
            amount=money(item.amount),
            actor=actor,
        )
        return item


@transaction.atomic(durable=True)
def reconciliation_record_executed(*, receipt_id: str, actor: str, note: str = "") -> Receipt:
    """Operator's external reconciliation result for a ``delivery_uncertain`` call: it ran; the charge stands.

    One result per receipt (``ReconciliationResult``): recording it again changes nothing; after
    "not executed" it is refused (409 ``reconciliation_decided``), and the refund item stays.
    """
    receipt = Receipt.objects.select_for_update(no_key=True).get(receipt_id=receipt_id)
    _require_signed_columns(receipt)
    if receipt.outcome != Outcome.DELIVERY_UNCERTAIN:
        raise RefundNotOwed("Only a delivery_uncertain receipt can be reconciled.", receipt_id=receipt_id)
    if not _record_result(receipt, ReconciliationVerdict.EXECUTED, actor=actor, note=note):
        return receipt
    _reconciliation_audit(receipt, "marked_executed", actor=actor, note=note[:200])
    return receipt


def _reconciliation_audit(
    receipt: Receipt, step: str, *, ok: bool = True, endpoint: str | None = None, **detail: Any
) -> None:
    """Audit a reconciliation step of ``receipt`` (event ``reconciliation.<step>``, detail naming the receipt)."""
    audit_record(
        event=f"reconciliation.{step}",
        ok=ok,
        tenant_id=receipt.tenant_id,
        wallet_id=receipt.wallet_id,
        tool=receipt.tool,
        endpoint=endpoint,
        detail={"receipt_id": receipt.receipt_id, **detail},
    )
