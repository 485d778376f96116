"""Phase 1 of the governed call: authorize on what was read, then claim in one statement, or record the refusal.

The claim (``gateway_claim``) inserts the action already ``dispatch_claimed``, consumes the quote,
debits, reserves and appends the audit event; a refusal writes nothing there, and the denial is
recorded in a transaction of its own.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone

from access.ratelimit import DeferredCharge
from audit.services import PreparedEvent, audit_event_prepare
from billing.exceptions import InsufficientFunds, SpendRefused, VelocityLimitExceeded
from billing.exceptions import money as _money
from billing.refusals import DEBIT_REFUSALS
from billing.selectors import caller_wallet
from billing.services import (
    DEBIT_COLUMNS,
    DebitCall,
    DebitResult,
    debit_call,
    refusal_for_viewer,
    wallet_check_may_spend,
)
from common import fastsql
from common.faults import fault_point
from common.ids import new_id
from common.records import record_json
from common.refusals import RefusedCall, refusal_exception
from mcpgateway.models import Action, ActionState, Tool, ToolSource
from mcpgateway.services.call import CallRequest, _uncharged
from mcpgateway.services.finish import _finish
from mcpgateway.services.lookup import _Found, _Stale
from mcpgateway.services.upstreams import upstream_check_open
from permits import exceptions as permit_exc
from permits.models import Permit, Quote
from permits.services import (
    DailyCap,
    authorize,
    daily_caps_record,
    permit_reservation_record,
    quote_check,
    quote_consumption_record,
)
from receipts.models import Outcome

# gateway_claim (mcpgateway/sql/gateway_claim.sql): the tenant, then one record per app, each built by the
# constructor of the app that owns its shape (docs/decisions.md, "Records between apps"); it answers
# billing_debit's columns and the rate-limit window's count.
_CLAIM_SQL = (
    f"SELECT {', '.join(DEBIT_COLUMNS)}, rate_count "  # noqa: S608
    "FROM gateway_claim(%s, %s::jsonb, %s::jsonb, %s::jsonb, %s::jsonb, %s::jsonb, %s::jsonb, %s::jsonb, %s::jsonb)"
)


CLAIM_REFUSED = "P0T01"  # the SQLSTATE gateway_claim raises a refusal with


def _claim(
    action: Action,
    quote: Quote | None,
    debit: DebitCall | None,
    permit: Permit,
    now: Any,
    event: PreparedEvent,
    found: _Found,
    deferred: DeferredCharge | None = None,
    daily_caps: Sequence[DailyCap] = (),
) -> DebitResult | None:
    """``gateway_claim``: insert the claimed action, consume the quote, debit, reserve and append the audit
    event, in one statement (its own transaction). Returns the debit's entries (None for a free call).
    ``daily_caps``: the policies' daily caps authorization applied, checked again after the debit.

    Raises the refusal (the debit's, ``QuoteUnavailable``, a policy's daily cap, or the permit's) with nothing written,
    ``_Stale`` when the tool, its price or the policies ``found`` holds changed since (cached or read for
    this call: the caller decides again on fresh rows), and ``IntegrityError`` when a
    concurrent request holds the same idempotency key. With ``deferred``, the claim also checks the
    cached key and charges its rate-limit window (``_Stale`` when the key changed or the window is
    full: the request is then charged on the rate limiter's path, which answers the refusal).
    """
    price = action.price
    wallet = action.wallet
    cached = {  # what the call was decided on, compared with the rows before anything is written
        "tool_version": found.tool.version if found.tool else None,
        "price": found.price,
        "ancestry": wallet.ancestry,
        "policies_version": found.policies_version,
    }
    params = [
        wallet.tenant_id,
        json.dumps(fastsql.json_row(action)),
        quote_consumption_record(
            quote=quote, wallet_id=wallet.wallet_id, tool=action.tool, action_id=action.action_id, now=now
        )
        if quote
        else None,
        debit.record() if debit else None,
        permit_reservation_record(permit=permit, amount=price or Decimal(0), now=now),
        event.record_in(),
        record_json(cached),
        deferred.claim_record() if deferred is not None else None,
        daily_caps_record(list(daily_caps)) if debit else None,
    ]
    try:
        with fastsql.own_transaction():
            row = fastsql.fetch_row(_CLAIM_SQL, params)
        assert row is not None
        *debit_row, rate_count = row
        answer = dict(zip(DEBIT_COLUMNS, debit_row, strict=True))
    except DatabaseError as err:
        refused = _claim_refusal(err)
        if refused is None:
            raise
        if refused["code"] in ("stale", "rate_limited"):  # decide again on fresh rows (common.refusals)
            raise _Stale() from None
        refusal = refusal_exception(
            refused,
            RefusedCall(
                amount=price or Decimal(0),
                wallet_id=wallet.wallet_id,
                permit_id=permit.permit_id,
                quote_id=action.quote_id or "",
                now=now,
                cap_wallets={cap.policy_id: cap.wallet_id for cap in daily_caps},
                policy_decision_id=action.policy_decision_id or "",
            ),
        )
        assert refusal is not None, refused
        if refused["code"] in DEBIT_REFUSALS:
            assert debit is not None  # the wallet that refuses may be an ancestor whose figures it may not read
            refusal = refusal_for_viewer(refusal, visible=refused["subject_id"] == debit.wallet_id)
        raise refusal from None
    fastsql.inserted(action)
    if deferred is not None:
        deferred.claimed(int(rate_count))
    return debit.result(answer) if debit else None


def _claim_refusal(err: DatabaseError) -> dict[str, Any] | None:
    """The answer a refusal of ``gateway_claim`` carries (its columns), or None for any other error."""
    cause = err.__cause__
    if getattr(cause, "sqlstate", None) != CLAIM_REFUSED:
        return None
    detail = json.loads(cause.diag.message_detail or "{}", parse_float=Decimal)  # type: ignore[union-attr]
    answer = {name: detail.get(name) for name in DEBIT_COLUMNS}
    return {name: Decimal(value) if isinstance(value, int) else value for name, value in answer.items()}


_REFUSALS = (permit_exc.PermitDenied, permit_exc.QuoteUnavailable, SpendRefused, InsufficientFunds)


def _phase1(
    req: CallRequest, found: _Found, tool: Tool, list_price: Decimal, digest: str
) -> tuple[Action, VelocityLimitExceeded | None]:
    """Authorize on what ``_lookup`` read, then claim in one statement; or record the refusal.

    Authorization (the permit's and the quote's signed statements in Python; the policies' rules by
    ``permits_policy_verdict``, read in the lookup's round trip) is decided first; the claim
    (``_claim``) inserts the action already claimed, consumes the quote, debits, reserves and appends
    the audit event in one statement, re-checking under its locks everything that can have changed
    since the read (statuses, funds, spend windows and the policies' daily caps, the permit's
    allowance and signed limits, the quote). A refusal writes nothing there; the denial (action, receipt,
    audit event) is then written in a transaction of its own. Raises ``IntegrityError`` when a
    concurrent request holds the same key.
    """
    now = timezone.now()
    key = req.principal.key
    wallet = caller_wallet(req.principal)
    action = Action(
        action_id=new_id("act"),
        tenant_id=wallet.tenant_id,
        wallet=wallet,
        api_key_id=key.key_id,
        idempotency_key=req.idempotency_key,
        request_hash=digest,
        tool=tool.service_id,
        arguments=req.arguments,
        transport=req.transport,
        quote_id=req.quote_id,
        created_at=now,
    )
    permit = found.permit
    server = found.tool.server if found.tool is not None else None
    try:
        if permit is None:
            raise permit_exc.PermitNotFound(permit_id=req.permit_id)
        if server is not None:
            # Disabled, not open to the tenant, or no credentials for it: refused before any debit.
            try:
                upstream_check_open(server=server, tenant_id=wallet.tenant_id)
            except permit_exc.PermitDenied:
                if found.cached:  # decided on a cached server row: decide again on a fresh one
                    raise _Stale() from None
                raise
            action.upstream_server_id = server.server_id
            action.upstream_url = server.url
            action.upstream_connect_timeout = server.connect_timeout
            action.upstream_read_timeout = server.read_timeout
        elif tool.source == ToolSource.UPSTREAM:
            action.upstream_url = settings.UPSTREAM_MCP_URL or None
        price, quote = list_price, None
        if req.quote_id:
            quote = quote_check(quote=found.quote, quote_id=req.quote_id, wallet=wallet, tool=tool.service_id, now=now)
            price = quote.quoted_credits
        decision = authorize(
            permit=permit,
            wallet=wallet,
            key_id=key.key_id,
            tool=tool.service_id,
            price=price,
            category=tool.category,
            server=server.slug if server is not None else None,
            now=now,
            # A cached permit's signed statement verified when it was cached, and the reservation requires
            # the row to still carry that signature and the signed limits.
            verify_signature=not found.cached,
            verdict=found.verdict,
        )
        action.policy_decision_id = decision.policy_decision_id
        if decision.refusal is not None:
            if found.cached:  # decided on cached rows (a permit's spend, say): decide again on fresh ones
                raise _Stale()
            raise decision.refusal
        debit = None
        if price <= 0:
            # Free calls still honour frozen/expired/closed; an ancestor's refusal without its figures.
            wallet_check_may_spend(wallet=wallet, reach_wallet_id=key.wallet_id)
        else:
            debit = debit_call(
                tenant_id=wallet.tenant_id,
                wallet_id=wallet.wallet_id,
                amount=price,
                service_category=tool.category,
                description=f"tool call {tool.service_id}",
                request_path=req.endpoint,
                correlation_id=action.action_id,
            )
        action.state = ActionState.DISPATCH_CLAIMED
        action.permit = permit
        action.price = price
        action.ledger_entry_id = debit.entry_id if debit else None
        action.claimed_at = timezone.now()
        event = audit_event_prepare(
            event="tool_call.dispatch_claimed",
            ok=True,
            tenant_id=wallet.tenant_id,
            wallet_id=wallet.wallet_id,
            key_id=key.key_id,
            tool=tool.service_id,
            endpoint=req.endpoint,
            policy_decision_id=action.policy_decision_id,
            detail={
                "action_id": action.action_id,
                "permit_id": permit.permit_id,
                "ledger_entry_id": debit.entry_id if debit else None,
                "amount": _money(price),
                "quote_id": req.quote_id or None,
                **(
                    {"upstream_server_id": action.upstream_server_id, "upstream_url": action.upstream_url}
                    if action.upstream_url
                    else {}
                ),
            },
        )
        fault_point("before_claim")
        posted = _claim(
            action,
            quote,
            debit,
            permit,
            now,
            event,
            found,
            req.deferred if _uncharged(req) else None,
            decision.daily_caps,
        )
        action.ledger_entry = posted.entry if posted is not None else None
        return action, None
    except _REFUSALS as refusal:
        if _uncharged(req):  # the request is charged before its denial is written: decided again, afresh
            raise _Stale() from None
        velocity = refusal if isinstance(refusal, VelocityLimitExceeded) else None
        outcome = Outcome.INSUFFICIENT_FUNDS if isinstance(refusal, InsufficientFunds) else Outcome.DENIED
        with transaction.atomic(durable=True):
            action.state = ActionState.ACCEPTED
            action.upstream_server_id = action.upstream_url = None  # nothing was sent anywhere
            action.upstream_connect_timeout = action.upstream_read_timeout = None
            action.permit = None
            action.price = None
            action.ledger_entry = None
            action.claimed_at = None
            action._state.adding = True
            fastsql.insert(action)
            _finish(
                action,
                state=ActionState.DENIED,
                outcome=outcome,
                reason_code=refusal.code,
                message=refusal.detail_message,
                extra=refusal.extra,
                permit=permit,
                credits_authorized=Decimal(0),
                credits_charged=Decimal(0),
                endpoint=req.endpoint,
                # 402 for funds, 403 for every other refusal (409 stays reserved for keys in progress).
                http_status=402 if isinstance(refusal, InsufficientFunds) else 403,
            )
        return action, velocity
