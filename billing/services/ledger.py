"""The double-entry ledger's building blocks, which run inside a transaction the caller holds:
``ledger_debit``, ``ledger_refund``, ``wallet_check_may_spend`` and ``debit_call`` (billing's
``debit_in`` record, which the tool gateway's ``gateway_claim`` hands to ``billing_debit_in`` inside
its phase-1 statement). Each is one call of a database function (billing/sql/): the money rules live
once, in PostgreSQL (docs/decisions.md); every posting is ``billing_post``'s.

Money movements (docs/architecture.md, "Money"). Each movement is one ledger
transaction: a debit entry on the source account and a credit entry on the
target account, summing to zero (the database checks the sum at commit). A
wallet's ``balance`` changes only together with its entry, under its row lock,
so it always equals the sum of its entries.

Spend controls, applied by the database function ``billing_debit``
(billing/sql/billing_debit.sql, behind ``ledger_debit``, the charge endpoint and the
gateway's claim) under the row locks, in this order:
status of the wallet and of every ancestor (closed, frozen, expired: 403; a
freeze covers the subtree); funds, counting an auto-refill the parent can pay
(402 ``insufficient_funds``, which freezes nothing); lifetime budget (403
``budget_exceeded``) and daily limit (403 ``daily_limit_exceeded``); velocity
(the debit would take net spend above 1000 credits in the last hour or 10000 in
the last day: 403 ``wallet_frozen`` and the wallet whose window would go over is
frozen). Budget, daily limit and velocity are checked for the charged wallet and
for every agent ancestor: an agent's limits bound its whole subtree, so no agent
escapes them by creating or funding children. Funding moves credits within the
subtree and is not spend; a sponsor's own controls count only its own charges.

"Spend" is net: charges minus refunds, so a refunded call (an upstream failure)
neither uses up the budget or the daily limit nor counts toward velocity. The
windows are counters (``SpendBucket``: one row per wallet and clock hour, UTC),
never aggregates over the ledger: "last hour" is the current and previous clock
hour, "last day" the current hour and the 24 before it (each never looser than
the rolling window, at most one hour stricter), the daily figure the hours since
00:00 UTC. ``total_spent`` (the budget's counter) is lifetime net spend; an
agent's includes its subtree's.

Auto-refill. When a debit would take the balance of a wallet and its children
under its refill threshold, ``refill_amount`` moves from the parent first, in the same
transaction, if the parent is active and can pay; a charge that the refill
makes coverable therefore succeeds. If the parent cannot pay, no refill happens
and the debit proceeds or fails on its own balance.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, TypedDict, TypeVar, Unpack

from django.db import DatabaseError, connection
from django.utils import timezone

from audit.services import audit_record
from billing.exceptions import money
from billing.models import LedgerEntry, LedgerKind, SystemAccount, Wallet
from billing.refusals import BALANCE_OVERFLOW, balance_overflow
from common import fastsql
from common.errors import ApplicationError, NotFound, RequestValidationError
from common.ids import new_id
from common.records import record_json
from common.refusals import RefusedCall, refusal_exception
from config.middleware import get_request_id

CENT = Decimal("0.00000001")
VELOCITY_HOUR_LIMIT = Decimal("1000")
VELOCITY_DAY_LIMIT = Decimal("10000")


def to_money(value: Decimal | int | str) -> Decimal:
    """``value`` as a Decimal with 8 places (half up)."""
    return Decimal(value).quantize(CENT, rounding=ROUND_HALF_UP)


def _require_atomic(name: str) -> None:
    if not connection.in_atomic_block:
        raise RuntimeError(f"{name} must run inside a transaction the caller holds")


def _lock(wallet_id: str) -> Wallet:
    """Lock one wallet row and return its current state."""
    wallet = Wallet.objects.select_for_update(no_key=True, of=("self",)).filter(wallet_id=wallet_id).first()
    if wallet is None:
        raise NotFound("No such wallet.", wallet_id=wallet_id)
    return wallet


_MAY_SPEND_SQL = "SELECT code, subject_id, refusal_reason FROM billing_wallet_may_spend(%s, %s, %s)"


def wallet_check_may_spend(*, wallet: Wallet, reach_wallet_id: str | None) -> None:
    """The status rule alone (closed, frozen, expired: 403), for what costs nothing or moves credit down.

    One call of ``billing_wallet_may_spend`` (billing/sql/billing_wallet_may_spend.sql), the rule's only
    copy, which the debit applies too: the wallet's current row, then its ancestors' (a freeze covers
    the subtree); the refusal names the wallet that stops it. ``reach_wallet_id`` is the wallet of the
    caller's key (None for an operator or the console): unless the wallet that refuses is within that
    reach, the refusal keeps its code and that wallet's id but not its figures (``refusal_for_viewer``;
    a velocity freeze reason counts the spend of the ancestor's whole subtree). A caller that holds the
    wallet's row lock reads the locked row.
    """
    with connection.cursor() as cursor:
        cursor.execute(_MAY_SPEND_SQL, [wallet.tenant_id, wallet.wallet_id, timezone.now()])
        code, subject_id, reason = cursor.fetchone()
    refusal = refusal_exception({"code": code, "subject_id": subject_id, "refusal_reason": reason}, RefusedCall())
    if refusal is not None:
        visible = subject_id == wallet.wallet_id or reach_wallet_id is None
        if not visible:
            path = Wallet.objects.filter(wallet_id=subject_id).values_list("path", flat=True).first() or ""
            visible = reach_wallet_id in path.split("/")
        raise refusal_for_viewer(refusal, visible=visible)


def _check_positive(amount: Decimal, *, loc: str = "amount") -> Decimal:
    amount = to_money(amount)
    if amount <= 0:
        raise RequestValidationError.single(["body", loc], "The amount must be greater than 0.", "greater_than")
    return amount


Account = Wallet | SystemAccount
_POST_SQL = (
    "SELECT source_balance, target_balance FROM billing_post(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
    "%s, %s)"
)


def _account(account: Account) -> str:
    return account.wallet_id if isinstance(account, Wallet) else str(account)


def _move(
    *,
    kind: LedgerKind,
    tenant_id: str,
    source: Account,
    target: Account,
    amount: Decimal,
    description: str = "",
) -> tuple[LedgerEntry, LedgerEntry]:
    """Post one balanced ledger transaction moving ``amount`` from ``source`` to ``target``: one call of
    ``billing_post`` (billing/sql/billing_post.sql), the one posting of money, which moves the balances
    with the entries. For the movements that are not spend (provision, fund, return on close); the
    debit and refunds post through it in the database (``billing_debit``, ``billing_refund``).

    Caller holds the transaction and the row locks of every wallet involved, and has checked that
    ``source`` can pay. Updates the wallets' balances in memory too. Refuses (422
    ``balance_overflow``) an amount that would take the target's balance past the largest a
    wallet holds, writing nothing. Returns (source entry, target entry).
    """
    now = timezone.now()
    transaction_id, source_entry_id, target_entry_id = new_id("ltx"), new_id("led"), new_id("led")
    description, correlation_id = description[:500], (get_request_id() or "")[:128]
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                _POST_SQL,
                [
                    tenant_id,
                    transaction_id,
                    kind,
                    _account(source),
                    _account(target),
                    amount,
                    source_entry_id,
                    target_entry_id,
                    Decimal(0),
                    "",
                    None,
                    description,
                    "",
                    correlation_id,
                    None,
                    now,
                ],
            )
            balances = cursor.fetchone()
    except DatabaseError as err:
        if getattr(err.__cause__, "sqlstate", None) == BALANCE_OVERFLOW:
            raise balance_overflow(_account(target)) from None
        raise
    entries = []
    for account, other, signed, entry_id, balance in (
        (source, target, -amount, source_entry_id, balances[0]),
        (target, source, amount, target_entry_id, balances[1]),
    ):
        wallet = account if isinstance(account, Wallet) else None
        if wallet is not None:
            wallet.balance = balance
        entry = LedgerEntry(
            entry_id=entry_id,
            transaction_id=transaction_id,
            tenant_id=tenant_id,
            wallet=wallet,
            account=_account(account),
            counterparty=_account(other),
            kind=kind,
            amount=signed,
            balance_after=balance,
            description=description,
            correlation_id=correlation_id,
            created_at=now,
        )
        fastsql.inserted(entry)  # written by the database function
        entries.append(entry)
    return entries[0], entries[1]


@dataclass(frozen=True)
class DebitResult:
    """What ``ledger_debit`` posted: the charge entry (on the wallet) and the refill entry, if any."""

    entry: LedgerEntry
    refill: LedgerEntry | None
    daily_spent: Decimal


R = TypeVar("R", bound=Exception)

# A spend refusal's figures of the wallet that refuses: its budget, spend, limits and freeze reason.
SPEND_FIGURES = ("budget", "total_spent", "daily_limit", "daily_spent", "limit", "spent", "frozen_reason")


def refusal_for_viewer(refusal: R, *, visible: bool) -> R:
    """``refusal`` as its caller may read it. A refusal by a wallet above the caller's reach (an agent
    ancestor's budget, daily limit, velocity window or freeze) keeps its code and that wallet's id, but
    not that wallet's figures: they count the spend of its other descendants, the caller's siblings."""
    if not visible and isinstance(refusal, ApplicationError):
        for name in SPEND_FIGURES:
            refusal.extra.pop(name, None)
    return refusal


# The answer of billing_debit (its OUT parameters), read by name.
DEBIT_COLUMNS = (
    "code",
    "subject_id",
    "wallet_tenant",
    "new_balance",
    "daily_spent",
    "refilled",
    "refill_parent",
    "figure",
    "figure_limit",
    "spend_window",
    "refusal_reason",
)
_DEBIT_SQL = f"SELECT {', '.join(DEBIT_COLUMNS)} FROM billing_debit_in(%s, %s::jsonb)"  # noqa: S608


@dataclass(frozen=True)
class DebitCall:
    """One prepared debit: what only Python does (ids, the time, truncated texts).

    ``record`` is billing's ``debit_in`` record, the debit as ``billing_debit_in`` takes it (its one
    constructor); ``result`` turns the answer into the posted entries or raises the refusal. The
    governed call's claim (``gateway_claim``) passes the record to the same function inside its own
    round trip.
    """

    tenant_id: str
    wallet_id: str
    amount: Decimal
    now: datetime
    service_category: str
    units: Decimal | None
    description: str
    request_path: str
    correlation_id: str
    ids: tuple[str, str, str, str, str, str]

    @property
    def entry_id(self) -> str:
        """The id the charge's wallet entry will have."""
        return self.ids[1]

    def record(self) -> str:
        """The ``debit_in`` record (billing/sql/billing_debit.sql, ``billing_debit_in``) as JSON text."""
        return record_json(
            {
                "wallet_id": self.wallet_id,
                "amount": self.amount,
                "now": self.now,
                "category": self.service_category,
                "units": self.units,
                "description": self.description,
                "request_path": self.request_path,
                "correlation_id": self.correlation_id,
                "ids": self.ids,
                "hour_limit": VELOCITY_HOUR_LIMIT,
                "day_limit": VELOCITY_DAY_LIMIT,
            }
        )

    def result(self, row: dict[str, Any]) -> DebitResult | None:
        """The posted entries (None for a replay), or raises the refusal ``row`` names."""
        refusal = refusal_exception(row, RefusedCall(amount=self.amount))
        if refusal is not None:
            raise refusal
        if row["code"] == "replay":
            return None
        ids, wallet_id = self.ids, self.wallet_id
        common = {"tenant_id": row["wallet_tenant"], "correlation_id": self.correlation_id, "created_at": self.now}
        refill = None
        if row["refilled"] is not None:
            refill = LedgerEntry(
                entry_id=ids[5],
                transaction_id=ids[3],
                wallet_id=wallet_id,
                account=wallet_id,
                counterparty=row["refill_parent"],
                kind=LedgerKind.REFILL,
                amount=row["refilled"],
                balance_after=row["new_balance"] + self.amount,
                description="auto-refill",
                **{**common, "created_at": self.now - timedelta(microseconds=1)},
            )
        entry = LedgerEntry(
            entry_id=ids[1],
            transaction_id=ids[0],
            wallet_id=wallet_id,
            account=wallet_id,
            counterparty=SystemAccount.REVENUE.value,
            kind=LedgerKind.CHARGE,
            amount=-self.amount,
            balance_after=row["new_balance"],
            service_category=self.service_category,
            units=self.units,
            description=self.description,
            request_path=self.request_path,
            **common,
        )
        for posted in (refill, entry):
            if posted is not None:
                fastsql.inserted(posted)  # written by the database function
        return DebitResult(entry=entry, refill=refill, daily_spent=row["daily_spent"])


class DebitDetail(TypedDict, total=False):
    """What a debit records beside its amount, each optional (``correlation_id``: the request id)."""

    service_category: str
    units: Decimal | None
    description: str
    request_path: str
    correlation_id: str


def debit_call(*, tenant_id: str, wallet_id: str, amount: Decimal, **detail: Unpack[DebitDetail]) -> DebitCall:
    """Prepare a debit of ``amount`` (positive, at 8 places) from ``wallet_id`` (a wallet of ``tenant_id``) to
    revenue."""
    return DebitCall(
        tenant_id=tenant_id,
        wallet_id=wallet_id,
        amount=amount,
        now=timezone.now(),
        service_category=detail.get("service_category", ""),
        units=detail.get("units"),
        description=detail.get("description", "")[:500],
        request_path=detail.get("request_path", "")[:300],
        correlation_id=(detail.get("correlation_id") or get_request_id() or "")[:128],
        ids=(new_id("ltx"), new_id("led"), new_id("led"), new_id("ltx"), new_id("led"), new_id("led")),
    )


def _debit(call: DebitCall) -> DebitResult:
    """One round trip: ``billing_debit_in`` (billing/sql/billing_debit.sql) with ``call``'s record.

    Returns the posted entries; raises the refusal as its exception. Caller holds the transaction.
    """
    with connection.cursor() as cursor:
        cursor.execute(_DEBIT_SQL, [call.tenant_id, call.record()])
        row = dict(zip(DEBIT_COLUMNS, cursor.fetchone(), strict=True))
    result = call.result(row)
    assert result is not None  # no idempotency key: never a replay
    return result


def _wallet_keys(wallet: Wallet | str) -> tuple[str, str]:
    """``(tenant_id, wallet_id)`` of a wallet or a wallet id (``NotFound`` for an unknown id)."""
    if isinstance(wallet, Wallet):
        return wallet.tenant_id, wallet.wallet_id
    tenant_id = Wallet.objects.filter(wallet_id=wallet).values_list("tenant_id", flat=True).first()
    if tenant_id is None:
        raise NotFound("No such wallet.", wallet_id=wallet)
    return tenant_id, wallet


def ledger_debit(*, wallet: Wallet | str, amount: Decimal, **detail: Unpack[DebitDetail]) -> DebitResult:
    """Charge ``amount`` from ``wallet`` to revenue. Caller holds the transaction.

    One call of the database function ``billing_debit``, the only copy of the
    spend rules: it takes the row locks (agent ancestors and the refill parent
    first, top down, then the wallet) and applies every spend control (see
    billing/sql/billing_debit.sql). Raises ``WalletClosed``,
    ``WalletFrozen``, ``WalletExpired``, ``BudgetExceeded``,
    ``DailyLimitExceeded`` (403) or ``InsufficientFunds`` (402); the caller's
    transaction must then roll back. ``VelocityLimitExceeded`` (a
    ``WalletFrozen``) additionally requires the caller, once its transaction has
    rolled back, to call ``wallet_freeze_for_velocity(exc=exc)``, which freezes
    the wallet whose window would have gone over (the charged wallet or an agent
    ancestor).

    Writes no audit event: the caller records the movement (``ledger_audit``
    or its own event naming the entry) as the last statement of its
    transaction. ``correlation_id`` defaults to the request id.
    """
    _require_atomic("ledger_debit")
    amount = to_money(amount)
    if amount <= 0:
        raise ValueError("a debit amount must be positive")
    tenant_id, wallet_id = _wallet_keys(wallet)
    return _debit(debit_call(tenant_id=tenant_id, wallet_id=wallet_id, amount=amount, **detail))


_REFUND_COLUMNS = ("code", "subject_id", "figure", "balance_after", "service_category", "correlation_id")
_REFUND_SQL = (
    f"SELECT {', '.join(_REFUND_COLUMNS)} "  # noqa: S608
    "FROM billing_refund(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)


def ledger_refund(
    *,
    amount: Decimal,
    charge: LedgerEntry | None = None,
    wallet: Wallet | str | None = None,
    description: str = "",
    request_path: str = "",
    correlation_id: str = "",
) -> LedgerEntry:
    """Move ``amount`` from revenue back to a wallet; returns the wallet's entry. Caller holds the transaction.

    One call of ``billing_refund`` (billing/sql/billing_refund.sql), the rule's only copy: with
    ``charge`` (a charge entry), refunds go to that charge's wallet and never exceed what is left
    of it (409 ``refund_exceeds_charge``); the wallet's row lock serializes concurrent refunds of
    one charge. Without it, ``wallet`` is required (an operator's goodwill credit out of revenue).
    Frozen and expired wallets accept refunds; closed wallets do not. Lowers the wallet's net
    spend (``total_spent`` and the windows of the charge's hour, its agent ancestors' too). Writes
    no audit event (see ``ledger_debit``).
    """
    _require_atomic("ledger_refund")
    amount = to_money(amount)
    if amount <= 0:
        raise ValueError("a refund amount must be positive")
    if charge is not None:
        tenant_id, wallet_id = charge.tenant_id, charge.wallet_id
    elif wallet is not None:
        tenant_id, wallet_id = _wallet_keys(wallet)
    else:
        raise ValueError("ledger_refund needs a charge or a wallet")
    now = timezone.now()
    transaction_id, revenue_entry_id, wallet_entry_id = new_id("ltx"), new_id("led"), new_id("led")
    correlation_id = correlation_id or (charge.correlation_id if charge is not None else "") or get_request_id() or ""
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                _REFUND_SQL,
                [
                    tenant_id,
                    charge.entry_id if charge is not None else None,
                    wallet_id,
                    amount,
                    transaction_id,
                    revenue_entry_id,
                    wallet_entry_id,
                    description[:500],
                    request_path[:300],
                    correlation_id[:128],
                    now,
                ],
            )
            row = dict(zip(_REFUND_COLUMNS, cursor.fetchone(), strict=True))
    except DatabaseError as err:
        if getattr(err.__cause__, "sqlstate", None) == BALANCE_OVERFLOW:
            raise balance_overflow(str(wallet_id)) from None
        raise
    answer = {**row, "charge_entry_id": charge.entry_id if charge is not None else None}
    refusal = refusal_exception(answer, RefusedCall(amount=amount))
    if refusal is not None:
        raise refusal
    return LedgerEntry.objects.get(entry_id=wallet_entry_id)


def ledger_event_detail(
    *,
    entry_id: str,
    transaction_id: str,
    kind: str,
    amount: str,
    balance_after: str | None,
    counterparty: str,
    service_category: str = "",
    request_path: str = "",
    refund_of: str | None = None,
    actor: str = "",
) -> dict[str, Any]:
    """The detail of a ``ledger.<kind>`` audit event: one definition for ``ledger_audit`` and the charge.

    ``amount`` and ``balance_after`` are money strings (``money``), or the charge's placeholders
    for the figures the database fills in.
    """
    detail: dict[str, Any] = {
        "entry_id": entry_id,
        "transaction_id": transaction_id,
        "kind": kind,
        "amount": amount,
        "balance_after": balance_after,
        "counterparty": counterparty,
    }
    if service_category:
        detail["service_category"] = service_category
    if request_path:
        detail["request_path"] = request_path
    if refund_of:
        detail["refund_of"] = refund_of
    if actor:
        detail["actor"] = actor
    return detail


def ledger_audit(entry: LedgerEntry, *, actor_key_id: str = "", actor: str = "", endpoint: str | None = None) -> None:
    """Record the movement of ``entry`` (a wallet's entry) in the tenant's audit chain.

    Caller holds the transaction; call it among the last statements (it locks the chain head).
    """
    audit_record(
        event=f"ledger.{entry.kind}",
        ok=True,
        tenant_id=entry.tenant_id,
        wallet_id=entry.account,
        key_id=actor_key_id or None,
        endpoint=endpoint,
        request_id=entry.correlation_id or None,
        detail=ledger_event_detail(
            entry_id=entry.entry_id,
            transaction_id=entry.transaction_id,
            kind=entry.kind,
            amount=money(entry.amount),
            balance_after=money(entry.balance_after) if entry.balance_after is not None else None,
            counterparty=entry.counterparty,
            service_category=entry.service_category,
            request_path=entry.request_path,
            refund_of=entry.refund_of_id,
            actor=actor,
        ),
    )
