"""Phase 3 of the governed call: record the outcome, refund where owed, sign the receipt, audit, store the answer.

``_finish`` settles every action that ends (phase 3, a denial in phase 1, the sweeper): the receipt
with its audit event and the action's final answer. The local dogfood tool runs inside phase 3's
transaction, so it has no dispatch uncertainty.
"""

from __future__ import annotations

import json
import logging
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.services import alert_raise, audit_append_prepared
from billing.exceptions import money as _money
from billing.models import Wallet
from billing.services import ledger_refund
from common import fastsql
from common.canonical import canonical_bytes_fast, sha256_hex
from common.errors import ApplicationError
from common.faults import fault_point
from common.ids import new_id
from mcpgateway.models import Action, ActionState
from mcpgateway.services.call import OUTCOME_STATUS, CallRequest, request_document
from mcpgateway.upstream.client import CallResult
from permits.models import Permit
from permits.services import permit_release
from receipts.models import Outcome
from receipts.services import receipt_prepare, refund_reconciliation_open

logger = logging.getLogger("tollgate.gateway")


def _response_hash(result: CallResult) -> str:
    body = result.result if result.result is not None else result.error
    return sha256_hex(canonical_bytes_fast(body)) if body is not None else ""


def _lock_claimed(action: Action) -> Action | None:
    """Lock the action row and confirm it is still claimed; None if someone else finished it.

    Only the state is read back: phase 1's object already holds the permit, the ledger entry and
    the wallet, none of which phase 3 may change under the action's lock.
    """
    row = fastsql.fetch_row(_LOCK_CLAIMED_SQL, [action.action_id])
    return action if row is not None and row[0] == ActionState.DISPATCH_CLAIMED else None


_LOCK_CLAIMED_SQL = "SELECT state FROM mcpgateway_action WHERE action_id = %s FOR NO KEY UPDATE"


# Upstream results that keep the charge and owe nothing back: (outcome, reason code).
_KEEPS_CHARGE = {
    "success": (Outcome.SUCCESS, ""),
    "tool_error": (Outcome.TOOL_ERROR, "tool_error"),
    "invalid_response": (Outcome.RESPONSE_REJECTED, "response_rejected"),
}


def _phase3(action: Action, result: CallResult) -> Action:
    """Record the upstream outcome, refund where owed, receipt and audit, in one transaction.

    When the charge stands (success, tool error, rejected answer) that is one statement in
    autocommit (``gateway_finish``: its own transaction); refunds and uncertain deliveries take
    several statements in one transaction.
    """
    kind = result.kind
    detail = {"upstream_kind": kind, "upstream_reason": result.reason[:200], "status_code": result.status_code}
    if kind in _KEEPS_CHARGE:
        outcome, reason_code = _KEEPS_CHARGE[kind]
        price = action.price or Decimal(0)
        fault_point("before_receipt")
        receipt = _finish(
            action,
            state=ActionState.COMPLETED,
            outcome=outcome,
            reason_code=reason_code,
            message=f"The upstream's answer was rejected: {result.reason[:200]}"
            if reason_code == "response_rejected"
            else "",
            result=None if reason_code == "response_rejected" else result.result,
            response_hash=_response_hash(result),
            credits_authorized=price,
            credits_charged=price,
            audit_detail=detail,
            while_claimed=True,
        )
        if receipt is None:
            # The sweeper declared it delivery_uncertain first; that receipt stands.
            logger.warning("action %s finished after it was swept (%s)", action.action_id, kind)
            return Action.objects.get(pk=action.pk)
        return action
    with transaction.atomic(durable=True):
        locked = _lock_claimed(action)
        fault_point("before_receipt")
        if locked is None:
            # The sweeper declared it delivery_uncertain first; that receipt stands.
            logger.warning("action %s finished after it was swept (%s)", action.action_id, result.kind)
            return Action.objects.get(pk=action.pk)
        price = locked.price or Decimal(0)
        if kind == "uncertain":
            _finish(
                locked,
                state=ActionState.DELIVERY_UNCERTAIN,
                outcome=Outcome.DELIVERY_UNCERTAIN,
                reason_code="delivery_uncertain",
                message=(
                    "The request may have reached the upstream but no complete answer came back. It will not "
                    "be re-sent; the charge is kept pending external reconciliation."
                ),
                credits_authorized=price,
                credits_charged=price,
                audit_detail=detail,
            )
            _alert_uncertain(locked, result.reason)
        else:  # not_sent, http_error, jsonrpc_error: the tool did not run, the charge is owed back
            upstream_error = result.error or {}
            _refund_and_finish(
                locked,
                price=price,
                reason_code=_refusal_code(result),
                message=str(upstream_error.get("message") or result.reason)[:300],
                extra={"upstream_error": upstream_error} if upstream_error else {},
                response_hash=_response_hash(result),
                audit_detail=detail,
            )
    return locked


def _refusal_code(result: CallResult) -> str:
    """The reason code of a call the upstream certainly did not run (``not_sent``, an HTTP or JSON-RPC error).

    A 401 or 403 is the upstream refusing the gateway's credentials for it: a definite refusal
    (``upstream_auth_refused``), refunded like every other, and never re-sent.
    """
    if result.status_code in (401, 403):
        return "upstream_auth_refused"
    return "upstream_error" if result.kind == "jsonrpc_error" else f"upstream_{result.kind}"


def _refund_and_finish(
    action: Action,
    *,
    price: Decimal,
    reason_code: str,
    message: str,
    extra: dict[str, Any],
    response_hash: str,
    audit_detail: dict[str, Any],
) -> None:
    """Refund the charge and release the allowance; if the refund cannot post, open a reconciliation item."""
    refund = None
    unrefunded_reason = ""
    if price > 0 and action.ledger_entry is not None:
        try:
            with transaction.atomic():
                # Lock order as in phase 1: the wallet row (the refund), then the permit row.
                refund = ledger_refund(
                    amount=price,
                    charge=action.ledger_entry,
                    description=f"refund: {action.tool} did not run",
                    correlation_id=action.action_id,
                )
                if action.permit_id:
                    permit_release(permit_id=action.permit_id, amount=price)
        except ApplicationError as err:
            unrefunded_reason = f"{err.code}: {err.detail_message}"[:300]
    elif action.permit_id:
        permit_release(permit_id=action.permit_id, amount=price)
    outcome = Outcome.FAILED_UNREFUNDED if unrefunded_reason else Outcome.FAILED_REFUNDED
    receipt = _finish(
        action,
        state=ActionState.COMPLETED,
        outcome=outcome,
        reason_code=reason_code,
        message=message,
        extra=extra,
        response_hash=response_hash,
        credits_authorized=price,
        credits_charged=price if unrefunded_reason else Decimal(0),
        refund_entry=refund,
        audit_detail={**audit_detail, **({"refund_error": unrefunded_reason} if unrefunded_reason else {})},
    )
    if unrefunded_reason:
        refund_reconciliation_open(receipt=receipt, amount=price, origin="failed_unrefunded", reason=unrefunded_reason)


def _alert_uncertain(action: Action, reason: str) -> None:
    alert_raise(
        tenant_id=action.tenant_id,
        wallet_id=action.wallet_id,
        kind="delivery_uncertain",
        severity="critical",
        message=(
            f"Delivery of {action.tool} (action {action.action_id}) could not be confirmed ({reason[:120]}). "
            "It was not re-sent; reconcile with the upstream."
        ),
        detail={"action_id": action.action_id, "tool": action.tool},
    )


def _finish(
    action: Action,
    *,
    state: str,
    outcome: str,
    credits_authorized: Decimal,
    credits_charged: Decimal,
    reason_code: str = "",
    message: str = "",
    extra: dict[str, Any] | None = None,
    result: dict[str, Any] | None = None,
    response_hash: str = "",
    permit: Permit | None = None,
    refund_entry: Any = None,
    endpoint: str = "",
    http_status: int | None = None,
    audit_detail: dict[str, Any] | None = None,
    while_claimed: bool = False,
) -> Any:
    """Issue the receipt (with its audit event) and store the action's final answer. Caller holds the transaction.

    With ``while_claimed`` all of it is one statement (``gateway_finish``), sent in autocommit by
    the caller, that first locks the action and checks it is still claimed: None (nothing
    written) when it is not.
    """
    wallet = action.wallet if isinstance(action.wallet, Wallet) else Wallet.objects.get(pk=action.wallet_id)
    receipt, event = receipt_prepare(
        action_id=action.action_id,
        wallet=wallet,
        api_key_id=action.api_key_id,
        tool=action.tool,
        outcome=outcome,
        request_document=request_document(action.tool, action.arguments),
        request_hash=action.request_hash,
        credits_authorized=credits_authorized,
        credits_charged=credits_charged,
        response_hash=response_hash,
        reason_code=reason_code,
        permit=permit or action.permit,
        ledger_entry=action.ledger_entry,
        refund_entry=refund_entry,
        quote_id=action.quote_id,
        policy_decision_id=action.policy_decision_id,
        upstream_server_id=action.upstream_server_id,
        upstream_url=action.upstream_url,
        endpoint=endpoint or f"transport:{action.transport}",
        audit_detail=audit_detail,
    )
    status, rpc_code = OUTCOME_STATUS[outcome]
    response: dict[str, Any] = {
        "action_id": action.action_id,
        "receipt_id": receipt.receipt_id,
        "outcome": outcome,
        "reason_code": reason_code,
        "credits_charged": _money(credits_charged),
        "http_status": http_status or status,
        "result": result,
        "error": None,
    }
    if rpc_code is not None:
        response["error"] = {
            "code": rpc_code,
            "message": message or outcome,
            "data": {
                "error": reason_code or outcome,
                "outcome": outcome,
                "receipt_id": receipt.receipt_id,
                "action_id": action.action_id,
                **(extra or {}),
            },
        }
    action.state = state
    action.outcome = outcome
    action.reason_code = reason_code
    action.receipt = receipt
    action.response = response
    action.completed_at = timezone.now()
    if while_claimed:
        with fastsql.own_transaction():
            row = fastsql.fetch_row(
                _FINISH_SQL,
                [
                    action.tenant_id,
                    action.action_id,
                    json.dumps(fastsql.json_row(receipt)),
                    state,
                    outcome,
                    reason_code,
                    receipt.receipt_id,
                    json.dumps(response),
                    action.completed_at,
                    event.record_in(),
                ],
            )
        if row is None or row[0] != "ok":
            return None
        fastsql.inserted(receipt)
        return receipt
    fastsql.insert(receipt)  # receipts are only ever inserted (``Receipt.save`` refuses updates)
    fastsql.update(action, ["state", "outcome", "reason_code", "receipt", "response", "completed_at"])
    audit_append_prepared(event)  # last: it locks the tenant's chain head until commit
    return receipt


# gateway_finish (mcpgateway/sql/gateway_finish.sql): the tenant, 8 arguments of its own, then audit's event record.
_FINISH_SQL = "SELECT gateway_finish(%s, %s, %s::jsonb, %s, %s, %s, %s, %s::jsonb, %s, %s::jsonb)"


# --- The local dogfood tool --------------------------------------------------------------


def _phase3_local(action: Action, req: CallRequest) -> Action:
    """Run ``partner.notes.write`` inside the final transaction: no dispatch uncertainty.

    Only while the action is still claimed: when the sweeper settled it first (this worker was
    slower than the sweep threshold), the tool does not run and the sweeper's answer stands.
    """
    from mcpgateway.models import PartnerNote

    with transaction.atomic(durable=True):
        locked = (
            Action.objects.select_for_update(no_key=True, of=("self",))
            .select_related("permit", "ledger_entry", "wallet")
            .filter(pk=action.pk, state=ActionState.DISPATCH_CLAIMED)
            .first()
        )
        if locked is None:
            logger.warning("local action %s was settled by the sweeper before it ran", action.action_id)
            return Action.objects.get(pk=action.pk)
        note = PartnerNote.objects.create(
            note_id=new_id("note"),
            tenant_id=locked.tenant_id,
            wallet_id=locked.wallet_id,
            action_id=locked.action_id,
            text=str(req.arguments.get("text", "")),
        )
        structured = {"note_id": note.note_id, "text": note.text}
        result = {
            "content": [{"type": "text", "text": f"Saved note {note.note_id}."}],
            "structuredContent": structured,
            "isError": False,
        }
        price = locked.price or Decimal(0)
        _finish(
            locked,
            state=ActionState.COMPLETED,
            outcome=Outcome.SUCCESS,
            result=result,
            response_hash=sha256_hex(canonical_bytes_fast(result)),
            credits_authorized=price,
            credits_charged=price,
            audit_detail={"local_tool": True},
        )
    return locked
