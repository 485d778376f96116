"""Authorization: ``authorize`` checks a call against the permit and the policy verdict of the wallet's
line. The policy bundles' rules are judged once, in PostgreSQL (``permits_policy_verdict``,
permits/sql/permits_policy_verdict.sql): ``policy_verdict_sql`` reads the verdict alongside other rows
(the governed call's lookup) and ``policy_verdict_from_json`` reads it back; Python only turns it into
the refusal. A pure read: the gateway runs it in its own phase-1 transaction and records the decision.
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
from common import fastsql
from common.ids import new_id
from common.records import record_json
from permits import exceptions as exc
from permits.models import Permit, PermitStatus
from permits.services.permits import permit_statement_problem

WILDCARD = "*"


def policy_verdict_sql(*, tool: str, server: str, category: str, amount: str, permit: str) -> str:
    """A scalar subquery: ``permits_policy_verdict`` of the wallet's line as one JSON array, in its order.

    Its first two parameters (``%s``) are the tenant and the wallet's path; ``tool``, ``server`` (the
    tool's upstream server's slug), ``category``, ``amount`` and ``permit`` (the permit's signed
    statement, jsonb) are SQL expressions (``%s`` too, or
    columns of the statement it sits in, as the governed call's lookup passes the tool's). Caps as
    strings; ``policy_verdict_from_json`` reads it back.
    """
    return (  # the expressions are the caller's SQL, never input
        "SELECT coalesce(jsonb_agg(jsonb_build_object('policy_id', v.policy_id, 'rule', v.rule, "  # noqa: S608
        "'cap_wallet_id', v.cap_wallet_id, 'cap', v.cap::text) ORDER BY v.n), '[]'::jsonb) "
        f"FROM permits_policy_verdict(%s, %s, {tool}, {server}, {category}, {amount}, {permit}) "
        "WITH ORDINALITY AS v(policy_id, rule, cap_wallet_id, cap, n)"
    )


@dataclass(frozen=True)
class DailyCap:
    """A policy's ``max_daily_credits`` as the claim checks it under its locks: the policy, the wallet
    whose spend today it caps (``permits_policy_verdict``'s cap_wallet_id) and the cap."""

    policy_id: str
    wallet_id: str
    limit: Decimal


@dataclass(frozen=True)
class PolicyVerdict:
    """``permits_policy_verdict``'s answer: the rule that refuses the call (the first one, its policy and
    its limit), or the daily caps the claim checks after its debit."""

    refused_by: tuple[str, str, Decimal | None] | None = None  # (policy_id, rule, limit)
    daily_caps: tuple[DailyCap, ...] = ()


def policy_verdict_from_json(text: str | list[Any]) -> PolicyVerdict:
    """The verdict of ``policy_verdict_sql``'s answer (JSON text or the decoded array)."""
    rows = json.loads(text) if isinstance(text, str) else text
    caps = []
    for row in rows:
        cap = Decimal(row["cap"]) if row["cap"] is not None else None
        if row["rule"] != "max_daily_credits":  # the refusing rows come first
            return PolicyVerdict(refused_by=(row["policy_id"], row["rule"], cap))
        assert cap is not None
        caps.append(DailyCap(row["policy_id"], row["cap_wallet_id"], cap))
    return PolicyVerdict(daily_caps=tuple(caps))


def policy_verdict_read(
    *,
    wallet: Wallet,
    tool: str,
    category: str | None,
    amount: Decimal,
    server: str | None = None,
    permit: Permit | None = None,
) -> PolicyVerdict:
    """The policy verdict of a call of ``tool`` (of the upstream server ``server``, a slug; None: a tool
    of no server) at ``amount`` by ``wallet`` under ``permit`` (its signed statement), in one statement."""
    statement = record_json(permit.signed_statement) if permit is not None else None
    row = fastsql.fetch_row(
        policy_verdict_sql(tool="%s", server="%s", category="%s", amount="%s", permit="%s::jsonb"),
        [wallet.tenant_id, wallet.ancestry, tool, server, category, amount, statement],
    )
    return policy_verdict_from_json(row[0] if row is not None else "[]")


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
    daily_caps: list[DailyCap] = field(default_factory=list)


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
    server: str | None = None,
    now: datetime | None = None,
    verify_signature: bool = True,
    verdict: PolicyVerdict | None = None,
) -> Decision:
    """Check the permit, then the policy verdict of the wallet's line (``permits_policy_verdict``).

    Pure read; the caller records the decision (its ``policy_decision_id``) on the audit event and
    raises ``decision.refusal`` when not allowed. ``server``: the slug of the tool's upstream server
    (None: a tool of no server, which a permit naming servers does not cover). ``verdict``: the verdict
    for this tool, server, category and price when the caller read it already (``policy_verdict_sql``);
    else it is read here. The policies' daily caps are not judged here: ``decision.daily_caps`` go to
    the claim, which checks them after its debit under the wallets' locks.
    """
    now = now or timezone.now()
    decision_id = new_id("pdec")

    def deny(err: exc.PermitDenied) -> Decision:
        err.extra.setdefault("policy_decision_id", decision_id)
        return Decision(decision_id, False, err)

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
    if permit.allowed_servers is not None and server not in permit.allowed_servers:
        return deny(exc.ServerNotPermitted(permit_id=permit.permit_id, tool=tool, server=server))

    if verdict is None:
        verdict = policy_verdict_read(
            wallet=wallet, tool=tool, server=server, category=category, amount=price, permit=permit
        )
    if verdict.refused_by is not None:
        policy_id, rule, limit = verdict.refused_by
        refusal = policy_rule_refusal(
            policy_id=policy_id, rule=rule, limit=limit, tool=tool, server=server, category=category, price=price
        )
        return deny(refusal)
    return Decision(decision_id, True, None, list(verdict.daily_caps))


def policy_rule_refusal(
    *,
    policy_id: str,
    rule: str,
    limit: Decimal | None,
    tool: str,
    server: str | None,
    category: str | None,
    price: Decimal,
) -> exc.PolicyDenied:
    """The refusal of a call by the rule ``permits_policy_verdict`` names (all but the daily cap)."""
    if rule == "max_credits_per_call":
        assert limit is not None
        return exc.PolicyDenied(policy_id=policy_id, rule=rule, limit=money(limit), required=money(price))
    if rule == "allowed_categories":
        return exc.PolicyDenied(policy_id=policy_id, rule=rule, category=category)
    if rule == "allowed_servers":
        return exc.PolicyDenied(policy_id=policy_id, rule=rule, tool=tool, server=server)
    if rule == "human_approval_required":
        return exc.PolicyDenied(policy_id=policy_id, rule=rule)
    return exc.PolicyDenied(policy_id=policy_id, rule=rule, tool=tool)  # denied_tools, allowed_tools


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
