"""Authorization: ``authorize`` checks a call against the permit and every enabled policy on the
wallet's line, and ``POLICIES_JSON_SQL`` / ``policies_from_json`` read those policies alongside
other rows. A pure read: the gateway runs it in its own phase-1 transaction and records the decision.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.utils import timezone

from billing.exceptions import money
from billing.models import Wallet
from billing.selectors import spend_windows
from common import fastsql
from common.ids import new_id
from common.records import record_json
from permits import exceptions as exc
from permits.models import Permit, PermitStatus, PolicyBundle
from permits.services.permits import permit_statement_problem

WILDCARD = "*"


# Every enabled policy on a wallet's line (its path: ``%s``), oldest first, as one JSON array of the
# fields authorization reads; amounts as strings. For statements that read the policies alongside
# other rows (the governed call's acceptance); ``policies_from_json`` reads it back.
POLICIES_JSON_SQL = (
    "SELECT coalesce(jsonb_agg(jsonb_build_object("
    "'policy_id', b.policy_id, 'wallet_id', b.wallet_id, 'allowed_tools', b.allowed_tools, "
    "'denied_tools', b.denied_tools, "
    "'max_credits_per_call', b.max_credits_per_call::text, 'max_daily_credits', b.max_daily_credits::text, "
    "'allowed_categories', b.allowed_categories, 'human_approval_required', b.human_approval_required) "
    "ORDER BY b.created_at), '[]'::jsonb) "
    "FROM permits_policy_bundle b WHERE b.wallet_id = ANY(%s) AND b.enabled"
)


def policies_from_json(text: str | list[Any]) -> list[PolicyBundle]:
    """The policies of ``POLICIES_JSON_SQL``'s answer, with the fields ``authorize`` reads."""
    rows = json.loads(text) if isinstance(text, str) else text
    return [
        PolicyBundle(
            policy_id=row["policy_id"],
            wallet_id=row["wallet_id"],
            allowed_tools=row["allowed_tools"],
            denied_tools=row["denied_tools"],
            max_credits_per_call=Decimal(row["max_credits_per_call"]) if row["max_credits_per_call"] else None,
            max_daily_credits=Decimal(row["max_daily_credits"]) if row["max_daily_credits"] else None,
            allowed_categories=row["allowed_categories"],
            human_approval_required=bool(row.get("human_approval_required")),
        )
        for row in rows
    ]


@dataclass(frozen=True)
class DailyCap:
    """A policy's ``max_daily_credits`` as the claim checks it again under its locks: the policy, the wallet
    whose spend today it caps (``daily_cap_wallet``) and the cap."""

    policy_id: str
    wallet_id: str
    limit: Decimal


def daily_caps_record(caps: list[DailyCap]) -> str | None:
    """The daily caps as the claim's record (JSON text: ``[{policy_id, wallet_id, limit}]``, what
    ``gateway_claim`` hands to ``billing_daily_cap_over``), or None without caps. The one constructor."""
    if not caps:
        return None
    return record_json([{"policy_id": c.policy_id, "wallet_id": c.wallet_id, "limit": c.limit} for c in caps])


@dataclass
class Decision:
    """The result of ``authorize``: allowed, or the refusal to raise; always a decision id. ``daily_caps``:
    the daily caps of the policies applied, for the claim to check under the wallets' locks."""

    policy_decision_id: str
    allowed: bool
    refusal: exc.PermitDenied | None = None
    policies: list[str] = field(default_factory=list)
    daily_caps: list[DailyCap] = field(default_factory=list)


def daily_cap_wallet(policy_wallet_id: str, wallet: Wallet) -> str:
    """The wallet whose spend today a policy's ``max_daily_credits`` caps for a call of ``wallet``.

    A policy binds its wallet's whole subtree, so its cap counts the subtree's spend, not the calling
    wallet's alone (else an agent under a capped policy would multiply the cap by creating children).
    A policy on an agent: that agent's spend, which counts everything below it. A policy on the
    sponsor: the spend of the agent line the call comes from (the sponsor's agent on the caller's
    path), so the sponsor's cap holds for each agent it funds with everything that agent creates;
    an agent cannot add lines, since wallets it creates sit below it. Either wallet is one the debit
    locks (``billing_debit``: the agent ancestors and the wallet), so the claim's check is exact.
    """
    ancestry = wallet.ancestry
    if policy_wallet_id == ancestry[0] and len(ancestry) > 1:
        return ancestry[1]
    return policy_wallet_id


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
    statement = permit.signed_statement
    for policy in policies:
        # A permit of a wallet's key under human approval: none can be issued now and the policy revoked
        # those it found; one still here (its row edited) is refused. Read from the signed statement
        # (verified above, or when the permit was cached), whose approval permit_statement_problem
        # checked: the issuer and the approval it names, never issued_via_request_id.
        if (
            policy.human_approval_required
            and statement.get("issuer_wallet_id") is not None
            and statement.get("approval") is None
        ):
            return deny(exc.PolicyDenied(policy_id=policy.policy_id, rule="human_approval_required"), applied)
    caps = [
        DailyCap(p.policy_id, daily_cap_wallet(p.wallet_id, wallet), p.max_daily_credits)
        for p in policies
        if p.max_daily_credits is not None
    ]
    spent_today = spend_windows(sorted({cap.wallet_id for cap in caps}), now=now) if caps else {}
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
            measured = daily_cap_wallet(policy.wallet_id, wallet)
            daily_spent = spent_today[measured].today
            if daily_spent + price > policy.max_daily_credits:
                return deny(
                    policy_daily_cap_refusal(
                        policy_id=policy.policy_id,
                        limit=policy.max_daily_credits,
                        # An ancestor line's spend counts the caller's siblings: not the caller's to read.
                        spent=daily_spent if measured == wallet.wallet_id else None,
                        price=price,
                    ),
                    applied,
                )
    return Decision(decision_id, True, None, applied, caps)


def policy_daily_cap_refusal(
    *, policy_id: str, limit: Decimal, spent: Decimal | None, price: Decimal
) -> exc.PolicyDenied:
    """The refusal of a call that would take the spend a policy caps past its ``max_daily_credits``.

    ``spent``: the capped spend today, or None when it is an ancestor line's (not the caller's to read).
    """
    refusal = exc.PolicyDenied(policy_id=policy_id, rule="max_daily_credits", limit=money(limit))
    if spent is not None:
        refusal.extra["spent"] = money(spent)
    refusal.extra["required"] = money(price)
    return refusal
