"""Billing failures, one class per domain failure (rendered by ``common.errors``)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from rest_framework import status

from common.errors import ApplicationError, Conflict, PermissionDeniedError
from common.formatting import credits_text


def money(value: Decimal) -> str:
    """A credit amount as its JSON string with 8 decimal places."""
    return f"{Decimal(value).quantize(Decimal('0.00000001')):f}"


def money_display(value: Decimal | None) -> str:
    """Credits for people (pages, the console): ``common.formatting.credits_text``. None is a dash."""
    return credits_text(value)


class SpendRefused(PermissionDeniedError):
    """Base of the spend controls' 403 refusals."""

    code = "spend_refused"
    message = "The wallet may not spend this amount."


class WalletFrozen(SpendRefused):
    code = "wallet_frozen"
    message = "The wallet is frozen; an operator must unfreeze it."


class VelocityLimitExceeded(WalletFrozen):
    """A debit would take the wallet's spend above the hourly or daily velocity limit.

    Rendered as ``wallet_frozen``. The wallet must be frozen in a transaction
    that commits although the debit is refused: the code that owns the
    outermost transaction catches this after rolling back and calls
    ``billing.services.wallet_freeze_for_velocity(exc=...)``.
    """

    def __init__(self, *, wallet_id: str, window: str, spent: Decimal, amount: Decimal, limit: Decimal) -> None:
        self.wallet_id = wallet_id
        self.window = window
        self.reason = (
            f"velocity: spend in the last {window} would reach {money(spent + amount)} "
            f"credits, above the limit of {money(limit)}"
        )
        super().__init__(
            "The debit would take the wallet's spend above its velocity limit; the wallet is now frozen.",
            wallet_id=wallet_id,
            window=window,
            limit=money(limit),
            spent=money(spent),
            required=money(amount),
        )


class WalletExpired(SpendRefused):
    code = "wallet_expired"
    message = "The wallet has expired."


class WalletClosed(SpendRefused):
    code = "wallet_closed"
    message = "The wallet is closed."


class BudgetExceeded(SpendRefused):
    code = "budget_exceeded"
    message = "The debit would exceed the wallet's lifetime budget."


class DailyLimitExceeded(SpendRefused):
    code = "daily_limit_exceeded"
    message = "The debit would exceed the wallet's daily spend limit."


class InsufficientFunds(ApplicationError):
    """402 with the InsufficientFundsResponse fields inside ``detail``."""

    code = "insufficient_funds"
    http_status = status.HTTP_402_PAYMENT_REQUIRED
    message = "The wallet's balance does not cover this amount."

    def __init__(self, *, wallet_id: str, balance: Decimal, required: Decimal, **extra: Any) -> None:
        super().__init__(
            wallet_id=wallet_id,
            balance=money(balance),
            required=money(required),
            shortfall=money(max(required - balance, Decimal(0))),
            **extra,
        )


class WalletNotActive(Conflict):
    """A funding or lifecycle change that the wallet's current status does not allow."""

    code = "wallet_not_active"
    message = "The wallet's status does not allow this operation."


class WalletHasOpenChildren(Conflict):
    code = "wallet_has_open_children"
    message = "Close the wallet's child wallets first."


class WalletHasOpenCalls(Conflict):
    code = "wallet_has_open_calls"
    message = (
        "A refund may still be owed to the wallet: let its calls in flight finish, record the reconciliation "
        "result of its delivery_uncertain calls and post its owed refunds, then close it."
    )


class RefundExceedsCharge(Conflict):
    code = "refund_exceeds_charge"
    message = "The refund would exceed what is left of the charge."


class ChargePolicyDenied(PermissionDeniedError):
    """A policy bundle on the wallet's line refuses a charge (``billing_charge``, ``permits_policy_verdict``).

    The same code as the governed call's refusal by a policy (``permits.exceptions.PolicyDenied``)."""

    code = "policy_denied"
    message = "A policy bundle denies this charge."


class WalletLimitRaiseDenied(PermissionDeniedError):
    """A wallet key tried to raise a limit of its own wallet, or to set a wallet below it above its own limit."""

    code = "wallet_limit_raise_denied"
    message = (
        "A wallet key may lower its own wallet's limits but never raise them, and may not set a wallet "
        "below it above its own limits; the operator or a key of a wallet above may."
    )
