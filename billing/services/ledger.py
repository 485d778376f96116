"""The double-entry ledger's building blocks, which run inside a transaction the caller holds:
``ledger_debit``, ``ledger_refund``, and ``debit_call`` (the arguments of the database function
``billing_debit``, which the tool gateway's ``gateway_claim`` runs inside its phase-1 transaction).

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
from typing import Any

from django.db import connection
from django.db.models import F, Q, Sum
from django.db.models.functions import Greatest
from django.utils import timezone

from audit.services import audit_record
from billing import selectors
from billing.exceptions import (
    BudgetExceeded,
    DailyLimitExceeded,
    InsufficientFunds,
    RefundExceedsCharge,
    VelocityLimitExceeded,
    WalletClosed,
    WalletExpired,
    WalletFrozen,
    money,
)
from billing.models import ZERO, LedgerEntry, LedgerKind, SystemAccount, Wallet, WalletStatus
from common import fastsql
from common.errors import ApplicationError, Conflict, NotFound, RequestValidationError
from common.ids import new_id
from config.middleware import get_request_id

CENT = Decimal("0.00000001")
# The columns of balances and entries are numeric(20,8): nothing may take a balance past this.
LARGEST_BALANCE = Decimal("999999999999.99999999")
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


def wallet_check_may_spend(*, wallet: Wallet, reach_wallet_id: str | None) -> None:
    """The status controls alone (closed, frozen, expired: 403), for calls that cost nothing.

    Reads the wallet's current row and its ancestors'; a zero-priced tool call must
    still be refused to a frozen, expired or closed wallet, or to one below such a wallet.
    ``reach_wallet_id`` is the wallet of the caller's key (None for an operator): an
    ancestor's refusal shows its figures only within that reach (``_check_line_may_spend``).
    """
    current = Wallet.objects.get(pk=wallet.pk)
    _check_may_spend(current)
    _check_line_may_spend(current, reach_wallet_id=reach_wallet_id)


def _check_may_spend(wallet: Wallet) -> None:
    """Status controls: closed, frozen and expired wallets spend nothing (403)."""
    if wallet.status == WalletStatus.CLOSED:
        raise WalletClosed(wallet_id=wallet.wallet_id)
    if wallet.status == WalletStatus.FROZEN:
        raise WalletFrozen(wallet_id=wallet.wallet_id, frozen_reason=wallet.frozen_reason)
    if wallet.is_expired:
        raise WalletExpired(wallet_id=wallet.wallet_id)


def _check_line_may_spend(wallet: Wallet, *, reach_wallet_id: str | None) -> None:
    """A freeze covers the subtree: refuse (403) when any ancestor is frozen, expired or closed.

    The refusal names the ancestor that stops the wallet (the debit applies the same
    rule in ``billing_debit``). ``reach_wallet_id`` is the wallet of the caller's key (None
    for an operator or the console): unless that ancestor is within its reach, the refusal
    keeps its code and the ancestor's id but not the ancestor's figures (``refusal_for_viewer``;
    a velocity freeze reason counts the spend of the ancestor's whole subtree).
    """
    ancestors = wallet.ancestry[:-1]
    if not ancestors:
        return
    blocked_id = (
        Wallet.objects.filter(wallet_id__in=ancestors)
        .filter(~Q(status=WalletStatus.ACTIVE) | Q(expires_at__lte=timezone.now()))
        .order_by("path")
        .values_list("wallet_id", flat=True)
        .first()
    )
    if blocked_id:
        blocked = Wallet.objects.get(wallet_id=blocked_id)
        try:
            _check_may_spend(blocked)
        except ApplicationError as refusal:
            visible = reach_wallet_id is None or reach_wallet_id in blocked.ancestry
            raise refusal_for_viewer(refusal, visible=visible) from None


def _check_positive(amount: Decimal, *, loc: str = "amount") -> Decimal:
    amount = to_money(amount)
    if amount <= 0:
        raise RequestValidationError.single(["body", loc], "The amount must be greater than 0.", "greater_than")
    return amount


Account = Wallet | SystemAccount


def _move(
    *,
    kind: LedgerKind,
    tenant_id: str,
    source: Account,
    target: Account,
    amount: Decimal,
    service_category: str = "",
    units: Decimal | None = None,
    description: str = "",
    request_path: str = "",
    correlation_id: str = "",
    refund_of: LedgerEntry | None = None,
    spend_delta: Decimal = ZERO,
) -> tuple[LedgerEntry, LedgerEntry]:
    """Post one balanced ledger transaction moving ``amount`` from ``source`` to ``target``.

    Caller holds the transaction and the row locks of every wallet involved,
    and has checked that ``source`` can pay. Updates the wallets' balances (and
    ``total_spent`` by ``spend_delta`` on the source for charges, or on the
    target for refunds, where it is negative) in memory and in the database.
    Refuses (422 ``balance_overflow``) an amount that would take the target's
    balance past ``LARGEST_BALANCE``, before writing anything.
    Returns (source entry, target entry).
    """
    if isinstance(target, Wallet) and target.balance + amount > LARGEST_BALANCE:
        raise RequestValidationError.single(
            ["body", "amount"],
            f"The amount would take the balance of {target.wallet_id} past {LARGEST_BALANCE}, "
            "the largest balance a wallet holds.",
            "balance_overflow",
        )
    now = timezone.now()
    transaction_id = new_id("ltx")
    correlation_id = correlation_id or get_request_id() or ""
    entries = []
    for account, other, signed in ((source, target, -amount), (target, source, amount)):
        wallet = account if isinstance(account, Wallet) else None
        balance_after = None
        if wallet is not None:
            balance_after = wallet.balance + signed
            changes: dict[str, Any] = {"balance": F("balance") + signed, "updated_at": now}
            if spend_delta and ((spend_delta > 0 and signed < 0) or (spend_delta < 0 and signed > 0)):
                changes["total_spent"] = Greatest(F("total_spent") + spend_delta, ZERO)
                wallet.total_spent = max(wallet.total_spent + spend_delta, ZERO)
            Wallet.objects.filter(wallet_id=wallet.wallet_id).update(**changes)
            wallet.balance = balance_after
        entries.append(
            LedgerEntry(
                entry_id=new_id("led"),
                transaction_id=transaction_id,
                tenant_id=tenant_id,
                wallet=wallet,
                account=wallet.wallet_id if wallet is not None else str(account),
                counterparty=other.wallet_id if isinstance(other, Wallet) else str(other),
                kind=kind,
                amount=signed,
                balance_after=balance_after,
                service_category=service_category,
                units=units,
                description=description[:500],
                request_path=request_path[:300],
                correlation_id=correlation_id[:128],
                refund_of=refund_of,
                created_at=now,
            )
        )
    LedgerEntry.objects.bulk_create(entries)
    return entries[0], entries[1]


@dataclass(frozen=True)
class DebitResult:
    """What ``ledger_debit`` posted: the charge entry (on the wallet) and the refill entry, if any."""

    entry: LedgerEntry
    refill: LedgerEntry | None
    daily_spent: Decimal


def _count_spend(*, owners: list[Wallet], tenant_id: str, hour: datetime, amount: Decimal) -> None:
    """Add ``amount`` (negative for a refund) to the owners' spend buckets of ``hour``, floored at zero.

    Also moves the lifetime ``total_spent`` of every owner but the last (the charged
    wallet itself, whose figure ``_move`` keeps). Caller holds the owners' row locks.
    """
    ids = [owner.wallet_id for owner in owners]
    with connection.cursor() as cursor:
        if amount > 0:
            cursor.execute(
                "INSERT INTO billing_spend_bucket (wallet_id, tenant_id, hour, amount) "
                "SELECT owner, %s, %s, %s FROM unnest(%s::text[]) AS owner "
                "ON CONFLICT (wallet_id, hour, tenant_id) "
                "DO UPDATE SET amount = billing_spend_bucket.amount + EXCLUDED.amount",
                [tenant_id, hour, amount, ids],
            )
        else:
            cursor.execute(
                "UPDATE billing_spend_bucket SET amount = GREATEST(amount + %s, 0) "
                "WHERE wallet_id = ANY(%s::text[]) AND hour = %s",
                [amount, ids, hour],
            )
    above = owners[:-1]
    if above:
        Wallet.objects.filter(wallet_id__in=[owner.wallet_id for owner in above]).update(
            total_spent=Greatest(F("total_spent") + amount, ZERO)
        )
        for owner in above:
            owner.total_spent = max(owner.total_spent + amount, ZERO)


# A spend refusal's figures of the wallet that refuses: its budget, spend, limits and freeze reason.
SPEND_FIGURES = ("budget", "total_spent", "daily_limit", "daily_spent", "limit", "spent", "frozen_reason")


def refusal_for_viewer(refusal: ApplicationError, *, visible: bool) -> ApplicationError:
    """``refusal`` as its caller may read it. A refusal by a wallet above the caller's reach (an agent
    ancestor's budget, daily limit, velocity window or freeze) keeps its code and that wallet's id, but
    not that wallet's figures: they count the spend of its other descendants, the caller's siblings."""
    if not visible:
        for name in SPEND_FIGURES:
            refusal.extra.pop(name, None)
    return refusal


def _refusal(row: dict[str, Any], amount: Decimal) -> ApplicationError | None:
    """The exception for a refusal code of ``billing_debit`` (None for ``ok`` and ``replay``)."""
    code, subject = row["code"], row["subject_id"]
    if code in ("ok", "replay"):
        return None
    if code == "not_found":
        return NotFound("No such wallet.", wallet_id=subject)
    if code == "wallet_closed":
        return WalletClosed(wallet_id=subject)
    if code == "wallet_frozen":
        return WalletFrozen(wallet_id=subject, frozen_reason=row["refusal_reason"])
    if code == "wallet_expired":
        return WalletExpired(wallet_id=subject)
    if code == "insufficient_funds":
        return InsufficientFunds(wallet_id=subject, balance=row["new_balance"], required=amount)
    if code == "budget_exceeded":
        return BudgetExceeded(
            wallet_id=subject,
            budget=money(row["figure_limit"]),
            total_spent=money(row["figure"]),
            required=money(amount),
        )
    if code == "daily_limit_exceeded":
        return DailyLimitExceeded(
            wallet_id=subject,
            daily_limit=money(row["figure_limit"]),
            daily_spent=money(row["figure"]),
            required=money(amount),
        )
    if code == "velocity":
        return VelocityLimitExceeded(
            wallet_id=subject, window=row["spend_window"], spent=row["figure"], amount=amount, limit=row["figure_limit"]
        )
    raise RuntimeError(f"billing_debit answered an unknown code {code!r}")


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
_DEBIT_SQL = f"SELECT {', '.join(DEBIT_COLUMNS)} FROM billing_debit({', '.join(['%s'] * 12)})"  # noqa: S608


@dataclass(frozen=True)
class DebitCall:
    """One prepared call of ``billing_debit``: what only Python does (ids, the time, truncated texts).

    ``params`` are the function's arguments in order; ``result`` turns its answer into the
    posted entries or raises the refusal. The governed call's claim (``gateway_claim``) passes
    the same arguments to the same function inside its own round trip.
    """

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

    def params(self, idempotency_key: str | None = None) -> list[Any]:
        return [
            self.wallet_id,
            self.amount,
            self.now,
            self.service_category,
            self.units,
            self.description,
            self.request_path,
            self.correlation_id,
            list(self.ids),
            VELOCITY_HOUR_LIMIT,
            VELOCITY_DAY_LIMIT,
            idempotency_key,
        ]

    def result(self, row: dict[str, Any]) -> DebitResult | None:
        """The posted entries (None for a replay), or raises the refusal ``row`` names."""
        refusal = _refusal(row, self.amount)
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


def debit_call(
    *,
    wallet_id: str,
    amount: Decimal,
    service_category: str = "",
    units: Decimal | None = None,
    description: str = "",
    request_path: str = "",
    correlation_id: str = "",
) -> DebitCall:
    """Prepare a debit of ``amount`` (positive, at 8 places) from ``wallet_id`` to revenue."""
    return DebitCall(
        wallet_id=wallet_id,
        amount=amount,
        now=timezone.now(),
        service_category=service_category,
        units=units,
        description=description[:500],
        request_path=request_path[:300],
        correlation_id=(correlation_id or get_request_id() or "")[:128],
        ids=(new_id("ltx"), new_id("led"), new_id("led"), new_id("ltx"), new_id("led"), new_id("led")),
    )


def _debit(call: DebitCall, idempotency_key: str | None = None) -> DebitResult | None:
    """One round trip: ``billing_debit`` (billing/sql/billing_debit.sql) with ``call``'s arguments.

    Returns the posted entries, or None when ``idempotency_key`` names a charge
    that committed while this call waited for the wallet's lock (a replay).
    Raises the refusal as its exception. Caller holds the transaction.
    """
    with connection.cursor() as cursor:
        cursor.execute(_DEBIT_SQL, call.params(idempotency_key))
        row = dict(zip(DEBIT_COLUMNS, cursor.fetchone(), strict=True))
    return call.result(row)


def ledger_debit(
    *,
    wallet: Wallet | str,
    amount: Decimal,
    service_category: str = "",
    units: Decimal | None = None,
    description: str = "",
    request_path: str = "",
    correlation_id: str = "",
) -> DebitResult:
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
    result = _debit(
        debit_call(
            wallet_id=wallet.wallet_id if isinstance(wallet, Wallet) else wallet,
            amount=amount,
            service_category=service_category,
            units=units,
            description=description,
            request_path=request_path,
            correlation_id=correlation_id,
        )
    )
    assert result is not None  # no idempotency key: never a replay
    return result


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

    With ``charge`` (a charge entry), refunds go to that charge's wallet and
    never exceed what is left of it (409 ``refund_exceeds_charge``); the
    wallet's row lock serializes concurrent refunds of one charge. Without it,
    ``wallet`` is required (an operator's goodwill credit out of revenue).
    Frozen and expired wallets accept refunds; closed wallets do not. Lowers
    the wallet's net spend (``total_spent`` and the daily figure). Writes no
    audit event (see ``ledger_debit``).
    """
    _require_atomic("ledger_refund")
    amount = to_money(amount)
    if amount <= 0:
        raise ValueError("a refund amount must be positive")
    if charge is not None:
        if charge.kind != LedgerKind.CHARGE or charge.wallet_id is None:
            raise Conflict("Only a charge entry of a wallet can be refunded.", entry_id=charge.entry_id)
        wallet_id = charge.wallet_id
    elif wallet is not None:
        wallet_id = wallet.wallet_id if isinstance(wallet, Wallet) else wallet
    else:
        raise ValueError("ledger_refund needs a charge or a wallet")
    path = Wallet.objects.filter(wallet_id=wallet_id).values_list("path", flat=True).first()
    if path is None:
        raise NotFound("No such wallet.", wallet_id=wallet_id)
    # Agent ancestors first, then the wallet: the lock order of the debit (``billing_debit``).
    ancestors = [_lock(ancestor_id) for ancestor_id in path.split("/")[1:-1]]
    locked = _lock(wallet_id)
    if locked.status == WalletStatus.CLOSED:
        raise WalletClosed(wallet_id=wallet_id)
    if charge is not None:
        refunded = LedgerEntry.objects.filter(refund_of=charge, account=wallet_id).aggregate(t=Sum("amount"))["t"]
        remaining = -charge.amount - (refunded or ZERO)
        if amount > remaining:
            raise RefundExceedsCharge(entry_id=charge.entry_id, remaining=money(remaining), requested=money(amount))
    _, entry = _move(
        kind=LedgerKind.REFUND,
        tenant_id=locked.tenant_id,
        source=SystemAccount.REVENUE,
        target=locked,
        amount=amount,
        service_category=charge.service_category if charge is not None else "",
        description=description,
        request_path=request_path,
        correlation_id=correlation_id or (charge.correlation_id if charge is not None else ""),
        refund_of=charge,
        spend_delta=-amount,
    )
    # The refund undoes spend in the windows the charge counted in: the buckets of the charge's hour.
    _count_spend(
        owners=[*ancestors, locked],
        tenant_id=locked.tenant_id,
        hour=selectors.spend_hour(charge.created_at if charge is not None else entry.created_at),
        amount=-amount,
    )
    return entry


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
