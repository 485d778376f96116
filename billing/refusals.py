"""The refusal codes of billing's database functions and the exceptions they become, registered in the one
map (``common.refusals``) when this module is imported.

``billing_debit``, ``billing_charge``, ``billing_refund``, ``billing_post`` and
``billing_wallet_may_spend`` (billing/sql/) answer a refusal as a code and the figures that go with it
(their columns: ``subject_id`` the wallet that refuses, ``figure`` and ``figure_limit``,
``spend_window``, ``refusal_reason``...). ``REFUSALS`` builds each code's exception, once, for every
caller: the ledger's services, the charge endpoint and the governed call's claim (for the debit it
carries), all through ``common.refusals.refusal_exception``.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from billing.exceptions import (
    BudgetExceeded,
    ChargePolicyDenied,
    DailyLimitExceeded,
    InsufficientFunds,
    RefundExceedsCharge,
    SpendRefused,
    VelocityLimitExceeded,
    WalletClosed,
    WalletExpired,
    WalletFrozen,
    money,
)
from common.errors import (
    ApplicationError,
    Conflict,
    IdempotencyKeyInProgress,
    IdempotencyKeyReused,
    NotFound,
    RequestValidationError,
    WalletAccessDenied,
)
from common.refusals import Build, RefusedCall, refusals_register

# What a refusal code becomes: a domain error, or the 422 shape (an idempotency conflict, an amount too small).
Refusal = ApplicationError | RequestValidationError

# billing_debit's refusals: each names the wallet that refuses, the charged wallet or an agent ancestor of it.
DEBIT_REFUSALS = frozenset(
    {
        "not_found",
        "wallet_closed",
        "wallet_frozen",
        "wallet_expired",
        "insufficient_funds",
        "budget_exceeded",
        "daily_limit_exceeded",
        "velocity",
    }
)

# SQLSTATE billing_post raises when an amount would take a wallet's balance past numeric(20,8)'s largest.
BALANCE_OVERFLOW = "TGBO1"
LARGEST_BALANCE = Decimal("999999999999.99999999")


def _velocity(row: Mapping[str, Any], call: RefusedCall) -> Refusal:
    return VelocityLimitExceeded(
        wallet_id=row["subject_id"],
        window=row["spend_window"],
        spent=row["figure"],
        amount=call.amount,
        limit=row["figure_limit"],
    )


def _over_cap(refusal: type[SpendRefused], *, cap: str, spent: str) -> Build:
    """The builder of a cap's refusal (the lifetime budget, the daily limit): the wallet that refuses, its cap
    and its spend under the wallet's own field names (``cap``, ``spent``), and what the call asked for."""

    def build(row: Mapping[str, Any], call: RefusedCall) -> Refusal:
        figures: dict[str, Any] = {cap: money(row["figure_limit"]), spent: money(row["figure"])}
        return refusal(wallet_id=row["subject_id"], **figures, required=money(call.amount))

    return build


def _amount_too_small(row: Mapping[str, Any], call: RefusedCall) -> Refusal:
    return RequestValidationError.single(
        ["query", "units"],
        f"The charge amount (price {money(row['unit_price'])} x units {money(row['units'])}) "
        "is zero at 8 decimal places.",
        "amount_too_small",
    )


def _charge_policy(row: Mapping[str, Any], call: RefusedCall) -> Refusal:
    """A policy bundle's refusal of a charge, worded as the governed call words one (``permits.services.
    authorization``): the policy and its rule, the limit, and for a daily cap the spend today when the
    caller may read the wallet it counts (``figure_visible``: an ancestor's counts the caller's siblings)."""
    rule = row["spend_window"]
    refusal = ChargePolicyDenied(policy_id=row["subject_id"], rule=rule)
    if rule == "allowed_categories":
        refusal.extra["category"] = row["category"]
        return refusal
    refusal.extra["limit"] = money(row["figure_limit"])
    if rule == "max_daily_credits" and row.get("figure_visible"):
        refusal.extra["spent"] = money(row["figure"])
    refusal.extra["required"] = money(call.amount)
    return refusal


# code -> the exception, from the function's answer (its columns by name) and the call (its amount).
REFUSALS: dict[str, Build] = {
    "not_found": lambda row, call: NotFound("No such wallet.", wallet_id=row["subject_id"]),
    "wallet_closed": lambda row, call: WalletClosed(wallet_id=row["subject_id"]),
    "wallet_frozen": lambda row, call: WalletFrozen(
        wallet_id=row["subject_id"], frozen_reason=row.get("refusal_reason")
    ),
    "wallet_expired": lambda row, call: WalletExpired(wallet_id=row["subject_id"]),
    "insufficient_funds": lambda row, call: InsufficientFunds(
        wallet_id=row["subject_id"], balance=row["new_balance"], required=call.amount
    ),
    "budget_exceeded": _over_cap(BudgetExceeded, cap="budget", spent="total_spent"),
    "daily_limit_exceeded": _over_cap(DailyLimitExceeded, cap="daily_limit", spent="daily_spent"),
    "velocity": _velocity,
    # billing_charge's (its answer with the call's ``category`` and ``units``, and ``figure_visible``)
    "idempotency_key_reused": lambda row, call: IdempotencyKeyReused(),
    "idempotency_key_in_progress": lambda row, call: IdempotencyKeyInProgress(headers={"Retry-After": "1"}),
    "access_denied": lambda row, call: WalletAccessDenied(wallet_id=row["subject_id"]),
    "unknown_category": lambda row, call: NotFound("No such service category.", service_category=row["category"]),
    "amount_too_small": _amount_too_small,
    "policy_denied": _charge_policy,
    # billing_refund's
    "not_refundable": lambda row, call: Conflict(
        "Only a charge entry of a wallet can be refunded.", entry_id=row["subject_id"]
    ),
    "refund_exceeds_charge": lambda row, call: RefundExceedsCharge(
        entry_id=row["charge_entry_id"], remaining=money(row["figure"]), requested=money(call.amount)
    ),
}


refusals_register(REFUSALS)


def balance_overflow(wallet_id: str) -> RequestValidationError:
    """422 ``balance_overflow``: what ``billing_post``'s SQLSTATE ``TGBO1`` becomes."""
    return RequestValidationError.single(
        ["body", "amount"],
        f"The amount would take the balance of {wallet_id} past {LARGEST_BALANCE}, the largest balance a wallet holds.",
        "balance_overflow",
    )
