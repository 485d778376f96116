"""Wallets: sponsor and agent wallets created, provisioned, funded, refunded, frozen, unfrozen and
closed. Every service owns its transaction (``@transaction.atomic(durable=True)``), moves money
with the ledger's building blocks (``billing.services.ledger``) and writes its audit events
inside it, as the last statements.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.services import alert_raise, audit_record
from billing.exceptions import (
    InsufficientFunds,
    VelocityLimitExceeded,
    WalletClosed,
    WalletHasOpenCalls,
    WalletHasOpenChildren,
    WalletLimitRaiseDenied,
    WalletNotActive,
    money,
)
from billing.models import (
    WALLET_PREFIX,
    APIKey,
    LedgerEntry,
    LedgerKind,
    SystemAccount,
    Wallet,
    WalletStatus,
    WalletType,
)
from billing.selectors import spend_windows
from billing.services.ledger import (
    _check_positive,
    _lock,
    _move,
    ledger_audit,
    ledger_refund,
    to_money,
    wallet_check_may_spend,
)
from common.errors import Conflict, RequestValidationError, WalletAccessDenied
from common.ids import new_id


def _audit_wallet(event: str, wallet: Wallet, *, actor_key_id: str, actor: str, **detail: Any) -> None:
    if actor:
        detail["actor"] = actor
    audit_record(
        event=event,
        ok=True,
        tenant_id=wallet.tenant_id,
        wallet_id=wallet.wallet_id,
        key_id=actor_key_id or None,
        detail=detail,
    )


def _reach_of(actor_key_id: str) -> str | None:
    """The wallet the acting key reaches from: None for an operator key, the console or ``manage.py``
    (no key), which read every wallet's figures; "" (reaching nothing) for a key that is not found."""
    if not actor_key_id:
        return None
    key = APIKey.objects.filter(key_id=actor_key_id).only("wallet_id").first()
    return "" if key is None else key.wallet_id


def _no_open_calls(wallet: Wallet) -> dict[str, int]:
    return {}


# The calls through which a refund may still come back to a wallet, counted by name (calls in flight,
# delivery_uncertain calls awaiting their reconciliation result, owed refunds). The gateway sits above
# this app (docs/architecture.md, "The apps") and registers the count (mcpgateway.apps); ``wallet_close`` reads it
# under the wallet's lock.
open_calls: Callable[[Wallet], dict[str, int]] = _no_open_calls


def _optional_money(value: Decimal | None) -> Decimal | None:
    return None if value is None else to_money(value)


@transaction.atomic(durable=True)
def wallet_create_sponsor(
    *,
    name: str = "",
    initial_credits: Decimal | int = 0,
    daily_limit: Decimal | None = None,
    expires_at: datetime | None = None,
    actor_key_id: str = "",
    actor: str = "",
) -> Wallet:
    """Create a sponsor wallet (a new tenant); provision ``initial_credits`` from mint in the same transaction.

    Operator only: the view and the admin console check that before calling.
    """
    wallet_id = new_id(WALLET_PREFIX[WalletType.SPONSOR])
    wallet = Wallet.objects.create(
        wallet_id=wallet_id,
        tenant_id=wallet_id,
        path=wallet_id,
        wallet_type=WalletType.SPONSOR,
        name=name,
        daily_limit=_optional_money(daily_limit),
        expires_at=expires_at,
    )
    credits = to_money(initial_credits)
    if credits < 0:
        raise RequestValidationError.single(["body", "initial_credits"], "Must be 0 or more.", "greater_than_equal")
    entry = None
    if credits > 0:
        _, entry = _move(
            kind=LedgerKind.PROVISION,
            tenant_id=wallet.tenant_id,
            source=SystemAccount.MINT,
            target=wallet,
            amount=credits,
            description="initial credits",
        )
    _audit_wallet("wallet.created", wallet, actor_key_id=actor_key_id, actor=actor, wallet_type=wallet.wallet_type)
    if entry is not None:
        ledger_audit(entry, actor_key_id=actor_key_id, actor=actor)
    return wallet


@transaction.atomic(durable=True)
def wallet_create_agent(
    *,
    parent: Wallet,
    name: str = "",
    initial_balance: Decimal | int = 0,
    budget: Decimal | None = None,
    daily_limit: Decimal | None = None,
    refill_threshold: Decimal | None = None,
    refill_amount: Decimal | None = None,
    expires_at: datetime | None = None,
    actor_key_id: str = "",
    actor: str = "",
) -> Wallet:
    """Create a wallet under ``parent`` (type ``agent`` under a sponsor, ``child`` under an agent).

    Funds it with ``initial_balance`` from the parent in the same transaction,
    under the parent's row lock: 402 when the parent cannot cover it. Nothing is
    created beneath a wallet that may not spend (frozen, expired, closed, or below
    such a wallet): 403. Children cannot have
    children (422). The caller has checked that the parent is in reach.
    """
    locked_parent = _lock(parent.wallet_id)
    if locked_parent.wallet_type == WalletType.CHILD:
        raise RequestValidationError.single(
            ["body", "parent_wallet_id"], "A child wallet cannot have child wallets.", "wallet_hierarchy"
        )
    # Nothing is created beneath a frozen, expired or closed wallet, or below one (403).
    wallet_check_may_spend(wallet=locked_parent, reach_wallet_id=_reach_of(actor_key_id))
    if (refill_threshold is None) != (refill_amount is None):
        raise RequestValidationError.single(
            ["body", "refill_amount"], "Set both refill_threshold and refill_amount, or neither.", "refill_pair"
        )
    amount = to_money(initial_balance)
    wallet_type = WalletType.AGENT if locked_parent.wallet_type == WalletType.SPONSOR else WalletType.CHILD
    wallet_id = new_id(WALLET_PREFIX[wallet_type])
    wallet = Wallet.objects.create(
        wallet_id=wallet_id,
        tenant_id=locked_parent.tenant_id,
        parent=locked_parent,
        path=f"{locked_parent.path}/{wallet_id}",
        wallet_type=wallet_type,
        name=name,
        budget=_optional_money(budget),
        daily_limit=_optional_money(daily_limit),
        refill_threshold=_optional_money(refill_threshold),
        refill_amount=_optional_money(refill_amount),
        expires_at=expires_at,
    )
    entry = None
    if amount > 0:
        if locked_parent.balance < amount:
            raise InsufficientFunds(wallet_id=locked_parent.wallet_id, balance=locked_parent.balance, required=amount)
        _, entry = _move(
            kind=LedgerKind.FUND,
            tenant_id=wallet.tenant_id,
            source=locked_parent,
            target=wallet,
            amount=amount,
            description="initial balance",
        )
    _audit_wallet(
        "wallet.created",
        wallet,
        actor_key_id=actor_key_id,
        actor=actor,
        wallet_type=wallet.wallet_type,
        parent_wallet_id=locked_parent.wallet_id,
    )
    if entry is not None:
        ledger_audit(entry, actor_key_id=actor_key_id, actor=actor)
    return wallet


@transaction.atomic(durable=True)
def wallet_provision(
    *, wallet: Wallet, amount: Decimal | int, description: str = "", actor_key_id: str = "", actor: str = ""
) -> LedgerEntry:
    """Credit a sponsor wallet with ``amount`` new credits from mint. Returns the sponsor's entry.

    Operator only (the admin console and ``manage.py``). Refused for non-sponsor
    wallets (409) and closed wallets (403).
    """
    amount = _check_positive(Decimal(amount))
    locked = _lock(wallet.wallet_id)
    if locked.wallet_type != WalletType.SPONSOR:
        raise WalletNotActive("Credits are provisioned to sponsor wallets only.", wallet_id=locked.wallet_id)
    if locked.status == WalletStatus.CLOSED:
        raise WalletClosed(wallet_id=locked.wallet_id)
    _, entry = _move(
        kind=LedgerKind.PROVISION,
        tenant_id=locked.tenant_id,
        source=SystemAccount.MINT,
        target=locked,
        amount=amount,
        description=description or "provision",
    )
    ledger_audit(entry, actor_key_id=actor_key_id, actor=actor)
    return entry


@transaction.atomic(durable=True)
def wallet_fund(
    *,
    source: Wallet,
    target: Wallet,
    amount: Decimal | int,
    description: str = "",
    actor_key_id: str = "",
    actor: str = "",
) -> LedgerEntry:
    """Move ``amount`` from ``source`` to its direct child ``target``. Returns the target's entry.

    Locks the parent, then the child. The source must be able to spend
    (active, unexpired: else 403) and cover the amount (else 402); the target
    must not be closed (403). Funding is not spend: no velocity, budget or
    daily limit applies.
    """
    amount = _check_positive(Decimal(amount))
    if target.parent_id != source.wallet_id:
        raise Conflict("Wallets are funded by their direct parent only.", source=source.wallet_id)
    locked_source = _lock(source.wallet_id)
    locked_target = _lock(target.wallet_id)
    wallet_check_may_spend(wallet=locked_source, reach_wallet_id=_reach_of(actor_key_id))
    if locked_target.status == WalletStatus.CLOSED:
        raise WalletClosed(wallet_id=locked_target.wallet_id)
    if locked_source.balance < amount:
        raise InsufficientFunds(wallet_id=locked_source.wallet_id, balance=locked_source.balance, required=amount)
    _, entry = _move(
        kind=LedgerKind.FUND,
        tenant_id=locked_target.tenant_id,
        source=locked_source,
        target=locked_target,
        amount=amount,
        description=description or "fund",
    )
    ledger_audit(entry, actor_key_id=actor_key_id, actor=actor)
    return entry


@transaction.atomic(durable=True)
def wallet_refund(
    *,
    amount: Decimal | int,
    charge: LedgerEntry | None = None,
    wallet: Wallet | None = None,
    description: str = "",
    request_path: str = "",
    correlation_id: str = "",
    actor_key_id: str = "",
    actor: str = "",
) -> LedgerEntry:
    """Refund ``amount`` from revenue to a charge's wallet (or to ``wallet``), audited. See ``ledger_refund``."""
    entry = ledger_refund(
        amount=Decimal(amount),
        charge=charge,
        wallet=wallet,
        description=description or "refund",
        request_path=request_path,
        correlation_id=correlation_id,
    )
    ledger_audit(entry, actor_key_id=actor_key_id, actor=actor)
    return entry


@transaction.atomic(durable=True)
def wallet_freeze(*, wallet: Wallet, reason: str = "", actor_key_id: str = "", actor: str = "") -> Wallet:
    """Freeze a wallet: it spends nothing until unfrozen. Freezing a frozen wallet changes nothing."""
    locked = _lock(wallet.wallet_id)
    if locked.status == WalletStatus.CLOSED:
        raise WalletClosed(wallet_id=locked.wallet_id)
    if locked.status == WalletStatus.FROZEN:
        return locked
    _set_frozen(locked, reason or "frozen by operator")
    alert_raise(
        tenant_id=locked.tenant_id,
        wallet_id=locked.wallet_id,
        kind="wallet_frozen",
        message=f"Wallet {locked.wallet_id} was frozen: {locked.frozen_reason}.",
        detail={"reason": locked.frozen_reason},
    )
    _audit_wallet("wallet.frozen", locked, actor_key_id=actor_key_id, actor=actor, reason=locked.frozen_reason)
    return locked


def _set_frozen(wallet: Wallet, reason: str) -> None:
    wallet.status = WalletStatus.FROZEN
    wallet.frozen_reason = reason[:200]
    wallet.frozen_at = timezone.now()
    wallet.save(update_fields=["status", "frozen_reason", "frozen_at", "updated_at"])


@transaction.atomic(durable=True)
def wallet_freeze_for_velocity(*, exc: VelocityLimitExceeded, actor_key_id: str = "") -> bool:
    """Commit the freeze that a refused debit's ``VelocityLimitExceeded`` calls for; alert and audit.

    Call it after the refused debit's transaction has rolled back. Returns
    False when the wallet was already frozen or closed (a concurrent refusal
    froze it first), so only one alert and one audit event are written.
    """
    locked = _lock(exc.wallet_id)
    if locked.status in (WalletStatus.FROZEN, WalletStatus.CLOSED):
        return False
    _set_frozen(locked, exc.reason)
    alert_raise(
        tenant_id=locked.tenant_id,
        wallet_id=locked.wallet_id,
        kind="wallet_frozen_velocity",
        severity="critical",
        message=f"Wallet {locked.wallet_id} was frozen automatically: {exc.reason}.",
        detail={"window": exc.window, "reason": exc.reason},
    )
    _audit_wallet(
        "wallet.frozen", locked, actor_key_id=actor_key_id, actor="velocity", reason=exc.reason, window=exc.window
    )
    return True


@transaction.atomic(durable=True)
def wallet_unfreeze(*, wallet: Wallet, actor_key_id: str = "", actor: str = "") -> Wallet:
    """Return a frozen wallet to ``active`` (operator only). Other statuses: 409.

    The velocity windows are not reset: a debit that still exceeds them freezes the wallet again.
    """
    locked = _lock(wallet.wallet_id)
    if locked.status != WalletStatus.FROZEN:
        raise WalletNotActive("Only a frozen wallet can be unfrozen.", wallet_id=locked.wallet_id, status=locked.status)
    previous = locked.frozen_reason
    locked.status = WalletStatus.ACTIVE
    locked.frozen_reason = ""
    locked.frozen_at = None
    locked.save(update_fields=["status", "frozen_reason", "frozen_at", "updated_at"])
    _audit_wallet("wallet.unfrozen", locked, actor_key_id=actor_key_id, actor=actor, previous_reason=previous)
    return locked


@transaction.atomic(durable=True)
def wallet_close(*, wallet: Wallet, actor_key_id: str = "", actor: str = "") -> Wallet:
    """Close a wallet for good. Its remaining balance returns to its parent (a sponsor's to mint).

    Refused (409) while the wallet has child wallets that are not closed, and while a refund may still
    be owed to it (``open_calls``): a refund posts to the charged wallet only, and a closed wallet takes
    none, so it would stay owed for ever. Locks the parent before the wallet. Closing a closed wallet
    changes nothing.
    """
    parent = _lock(wallet.parent_id) if wallet.parent_id else None
    locked = _lock(wallet.wallet_id)
    if locked.status == WalletStatus.CLOSED:
        return locked
    if Wallet.objects.filter(parent=locked).exclude(status=WalletStatus.CLOSED).exists():
        raise WalletHasOpenChildren(wallet_id=locked.wallet_id)
    owed: dict[str, Any] = {name: count for name, count in open_calls(locked).items() if count}
    if owed:
        counts = ", ".join(f"{name.replace('_', ' ')}: {count}" for name, count in owed.items())
        raise WalletHasOpenCalls(f"{WalletHasOpenCalls.message} ({counts})", wallet_id=locked.wallet_id, **owed)
    entry = None
    if locked.balance > 0:
        entry, _ = _move(
            kind=LedgerKind.RETURN,
            tenant_id=locked.tenant_id,
            source=locked,
            target=parent if parent is not None else SystemAccount.MINT,
            amount=locked.balance,
            description="balance returned on close",
        )
    locked.status = WalletStatus.CLOSED
    locked.closed_at = timezone.now()
    locked.save(update_fields=["status", "closed_at", "updated_at"])
    _audit_wallet("wallet.closed", locked, actor_key_id=actor_key_id, actor=actor)
    if entry is not None:
        ledger_audit(entry, actor_key_id=actor_key_id, actor=actor)
    return locked


# The settings ``wallet_settings_change`` changes; the first four are limits (None: no limit).
WALLET_LIMITS = ("budget", "daily_limit", "refill_threshold", "refill_amount")
WALLET_SETTINGS = ("name", *WALLET_LIMITS)


@dataclass(frozen=True)
class WalletSettingsChange:
    """What ``wallet_settings_change`` did: the wallet after it, each changed setting's before and after
    (money as strings), and notices for the caller (a limit now under what is already spent)."""

    wallet: Wallet
    changes: dict[str, dict[str, Any]]
    notices: list[str]


def _setting_shown(value: Any) -> Any:
    return money(value) if isinstance(value, Decimal) else value


def _raises(before: Decimal | None, after: Decimal | None) -> bool:
    """Whether ``after`` allows more than ``before`` (None: no limit, the most)."""
    if after is None:
        return before is not None
    return before is not None and after > before


def _check_limit_authority(locked: Wallet, reach: Wallet | None, settings: dict[str, Any], changed: list[str]) -> None:
    """The "lower but never raise" rule, judged on the locked rows (docs/decisions.md, Operator console).

    No reach (the operator, the console, ``manage.py``): any value. A key changing its own wallet: each
    changed limit may only go down (an auto-refill draws on the parent, so a larger refill is a raise, and
    adding one where there was none too). A key changing a wallet below its own: no budget or daily limit
    above its own wallet's (and none left unlimited while its own is limited).
    """
    if reach is None:
        return
    if reach.wallet_id == locked.wallet_id:
        for name in changed:
            before, after = getattr(locked, name), settings[name]
            if name in ("refill_threshold", "refill_amount"):
                # No refill (None) draws nothing: adding one, or a larger one, is the raise.
                raised = after is not None and (before is None or after > before)
            else:
                raised = name in WALLET_LIMITS and _raises(before, after)
            if raised:
                raise WalletLimitRaiseDenied(wallet_id=locked.wallet_id, setting=name)
        return
    for name in ("budget", "daily_limit"):
        own = getattr(reach, name)
        if name in changed and _raises(own, settings[name]):
            raise WalletLimitRaiseDenied(wallet_id=locked.wallet_id, setting=name, reach_wallet_id=reach.wallet_id)


@transaction.atomic(durable=True)
def wallet_settings_change(
    *, wallet: Wallet, changes: dict[str, Any], actor_key_id: str = "", actor: str = ""
) -> WalletSettingsChange:
    """Change some of a wallet's settings (name, budget, daily limit, auto-refill); the others stay.

    The caller has checked that the wallet is in the acting key's reach. Locks the acting key's wallet
    (when it is an ancestor) before the wallet, ancestor first as every service does, then judges the
    change on the locked rows: who may raise what (``_check_limit_authority``: 403
    ``wallet_limit_raise_denied``), sponsors have no budget or auto-refill and the refill pair is set
    together (422), a closed wallet changes no more (403). The spend rules read the limits at charge time
    (billing/sql/billing_debit.sql), so a change applies from the next charge; a limit set under what the
    wallet has already spent in its window (today, or its lifetime for the budget) is kept and said so in
    ``notices``: charges are refused until the window moves on. Audited as ``wallet.settings_changed``
    with every changed setting's before and after. A change that changes nothing is not audited.
    """
    unknown = sorted(set(changes) - set(WALLET_SETTINGS))
    if unknown:
        raise RequestValidationError.single(["body", unknown[0]], "Not a wallet setting.", "unknown_setting")
    reach_id = _reach_of(actor_key_id)
    if reach_id == "":
        raise WalletAccessDenied(wallet_id=wallet.wallet_id)
    reach = _lock(reach_id) if reach_id and reach_id != wallet.wallet_id else None
    locked = _lock(wallet.wallet_id)
    if reach_id and reach_id == wallet.wallet_id:
        reach = locked
    if reach is not None and not (
        locked.tenant_id == reach.tenant_id and locked.ancestry[: len(reach.ancestry)] == reach.ancestry
    ):
        raise WalletAccessDenied(wallet_id=locked.wallet_id)
    if locked.status == WalletStatus.CLOSED:
        raise WalletClosed(wallet_id=locked.wallet_id)
    settings = {name: getattr(locked, name) for name in WALLET_SETTINGS}
    for name, value in changes.items():
        if name == "name":
            settings[name] = (value or "").strip()
            if len(settings[name]) > 200:
                raise RequestValidationError.single(["body", "name"], "At most 200 characters.", "string_too_long")
        else:
            settings[name] = _optional_money(value)
            if settings[name] is not None and settings[name] < 0:
                raise RequestValidationError.single(["body", name], "Must be 0 or more.", "greater_than_equal")
    if locked.wallet_type == WalletType.SPONSOR:
        for name in ("budget", "refill_threshold", "refill_amount"):
            if settings[name] is not None:
                raise RequestValidationError.single(
                    ["body", name], "A sponsor wallet has no budget or auto-refill.", "sponsor_setting"
                )
    if (settings["refill_threshold"] is None) != (settings["refill_amount"] is None):
        raise RequestValidationError.single(
            ["body", "refill_amount"], "Set both refill_threshold and refill_amount, or neither.", "refill_pair"
        )
    if settings["refill_amount"] is not None and settings["refill_amount"] <= 0:
        raise RequestValidationError.single(["body", "refill_amount"], "Must be more than 0.", "greater_than")
    changed = [name for name in WALLET_SETTINGS if settings[name] != getattr(locked, name)]
    _check_limit_authority(locked, reach, settings, changed)
    if not changed:
        return WalletSettingsChange(wallet=locked, changes={}, notices=[])
    before = {name: getattr(locked, name) for name in changed}
    for name in changed:
        setattr(locked, name, settings[name])
    locked.save(update_fields=[*changed, "updated_at"])
    notices = []
    if "daily_limit" in changed and locked.daily_limit is not None:
        today = spend_windows([locked.wallet_id])[locked.wallet_id].today
        if today > 0 and today >= locked.daily_limit:
            notices.append(
                f"The daily limit {money(locked.daily_limit)} is at or under what the wallet has already spent today "
                f"({money(today)}): it applies from the next charge, which is refused until 00:00 UTC."
            )
    if "budget" in changed and locked.budget is not None and 0 < locked.total_spent >= locked.budget:
        notices.append(
            f"The budget {money(locked.budget)} is at or under the wallet's lifetime spend "
            f"({money(locked.total_spent)}): it applies from the next charge, which is refused."
        )
    diff = {
        name: {"before": _setting_shown(before[name]), "after": _setting_shown(getattr(locked, name))}
        for name in changed
    }
    _audit_wallet(
        "wallet.settings_changed",
        locked,
        actor_key_id=actor_key_id,
        actor=actor,
        changes=diff,
        **({"notices": notices} if notices else {}),
    )
    return WalletSettingsChange(wallet=locked, changes=diff, notices=notices)
