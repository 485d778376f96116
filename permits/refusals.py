"""The refusal codes of the permit's and the quote's database functions, as ``gateway_claim`` answers them,
and the exceptions they become: registered in the one map (``common.refusals``) when this module is
imported (``PermitsConfig.ready``).

``permits_quote_consume_in`` refusing is ``quote_unavailable``, ``permits_reserve_in`` refusing is
``permit_refused`` (why is read afresh: ``permit_reserve_refusal``), and a policy's daily cap gone over
after the debit (``billing_daily_cap_over``) is ``policy_daily_cap`` (the policy as ``subject_id``, the
spend before the call as ``figure``, the cap as ``figure_limit``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common.refusals import Build, RefusedCall, refusals_register
from permits import exceptions as exc
from permits.services import permit_reserve_refusal, policy_daily_cap_refusal


def _permit_refused(row: Mapping[str, Any], call: RefusedCall) -> Exception:
    assert call.now is not None
    return permit_reserve_refusal(permit_id=call.permit_id, amount=call.amount, now=call.now)


def _policy_daily_cap(row: Mapping[str, Any], call: RefusedCall) -> Exception:
    policy_id = row["subject_id"]
    refusal = policy_daily_cap_refusal(
        policy_id=policy_id,
        limit=row["figure_limit"],
        # The spend of the line the policy caps: the caller's own, or an ancestor's it may not read.
        spent=row["figure"] if call.cap_wallets.get(policy_id) == call.wallet_id else None,
        price=call.amount,
    )
    if call.policy_decision_id:  # as authorize's refusals carry it
        refusal.extra["policy_decision_id"] = call.policy_decision_id
    return refusal


REFUSALS: dict[str, Build] = {
    "quote_unavailable": lambda row, call: exc.QuoteUnavailable(quote_id=call.quote_id),
    "permit_refused": _permit_refused,
    "policy_daily_cap": _policy_daily_cap,
}

refusals_register(REFUSALS)
