"""Billing writes: API keys, wallets, the double-entry ledger, charges and prices.

Every public service owns its transaction (``@transaction.atomic(durable=True)``)
and writes its audit events inside it, as the last statements. The exceptions
are the building blocks ``ledger_debit`` and ``ledger_refund``, which run
inside a transaction the caller holds, and ``debit_call`` (the arguments of the
database function ``billing_debit``, which the tool gateway's ``gateway_claim``
runs inside its phase-1 transaction).

Money movements (DESIGN.md section 5). Each movement is one ledger
transaction: a debit entry on the source account and a credit entry on the
target account, summing to zero (the database checks the sum at commit). A
wallet's ``balance`` changes only together with its entry, under its row lock,
so it always equals the sum of its entries.

Lock order. Wallet row locks are always taken ancestor first: a parent before
its child (funding, auto-refill, closing), the agent ancestors of a charged or
refunded wallet before the wallet (their spend windows change with it), and the
audit chain head last. Two transactions therefore never wait on each other in a
cycle.

Spend controls, applied by the database function ``billing_debit``
(billing/migrations/0008, behind ``ledger_debit``, the charge endpoint and the
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

Auto-refill. When a debit would take a wallet's balance under its refill
threshold, ``refill_amount`` moves from the parent first, in the same
transaction, if the parent is active and can pay; a charge that the refill
makes coverable therefore succeeds. If the parent cannot pay, no refill happens
and the debit proceeds or fails on its own balance.

Charge idempotency. ``wallet_charge`` takes an optional key, scoped by wallet.
The key row (request hash and the stored response) is written in the debit's
transaction, so it exists exactly when the debit committed. The same key and
parameters replay the stored response; other parameters are the idempotency
conflict (422), with nothing written. A concurrent duplicate waits on the
wallet row lock, then finds the committed row and replays. A refused charge
(402, 403) writes nothing, so it does not burn the key: the client may retry
the same key once the wallet can pay. The velocity freeze is the one write that
survives a refusal; it commits in its own transaction after the refused debit
rolled back. The charge endpoint is one statement, the database function
``billing_charge`` (billing/sql/billing_charge.sql); charges of one wallet that
meet in a gateway process share one commit (group commit, ``_charge_row_grouped``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import TYPE_CHECKING, Any, Unpack

from django.db import DatabaseError, connection, transaction
from django.db.models import F, Q, Sum
from django.db.models.functions import Greatest
from django.utils import timezone

from audit.canonical import canonical_bytes_fast
from audit.models import AuditEvent
from audit.services import EventFields, alert_raise, audit_event_prepare, audit_record
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
    WalletHasOpenChildren,
    WalletNotActive,
    money,
)
from billing.keys import hash_secret, make_secret
from billing.models import (
    DEFAULT_CATEGORY_PRICES,
    WALLET_PREFIX,
    ZERO,
    APIKey,
    APIKeyStatus,
    KeyLogAction,
    KeyRotationLog,
    LedgerEntry,
    LedgerKind,
    ServiceCategory,
    ServicePrice,
    SystemAccount,
    ToolPrice,
    Wallet,
    WalletStatus,
    WalletType,
)
from billing.ratelimit import DeferredCharge, DeferredRefused
from config import fastsql
from config.errors import (
    ApplicationError,
    Conflict,
    IdempotencyKeyInProgress,
    IdempotencyKeyReused,
    NotFound,
    RequestValidationError,
    WalletAccessDenied,
)
from config.idempotency import request_hash
from config.ids import new_id
from config.middleware import get_request_id

if TYPE_CHECKING:
    from config.authentication import Principal


@dataclass(frozen=True)
class IssuedKey:
    """A key together with its secret, which exists only in this object and the one response."""

    key: APIKey
    secret: str


def _new_key(*, wallet: Wallet | None, name: str, rotated_from: str = "", actor_key_id: str = "") -> IssuedKey:
    key_id = new_id("key")
    secret = make_secret(key_id)
    key = APIKey.objects.create(
        key_id=key_id,
        wallet=wallet,
        tenant_id=wallet.tenant_id if wallet else None,
        name=name,
        secret_hash=hash_secret(secret),
        secret_last4=secret[-4:],
        rotated_from=rotated_from,
        created_by_key_id=actor_key_id,
    )
    return IssuedKey(key=key, secret=secret)


@transaction.atomic(durable=True)
def api_key_create(*, wallet: Wallet, name: str = "", actor_key_id: str = "", actor: str = "") -> IssuedKey:
    """Create a wallet-scoped key. The secret is returned once and only its hash is stored.

    ``actor_key_id`` (the minting key) is recorded as the new key's creator: revoking the
    creator revokes the new key too (``_revoke_lineage``). The creator's row is locked
    and re-checked here, so a key minted while its creator is being revoked either
    commits first (and is then found by the revocation) or is refused (401).
    """
    _lock_wallet(wallet)
    _require_active_minter(actor_key_id)
    issued = _new_key(wallet=wallet, name=name, actor_key_id=actor_key_id)
    KeyRotationLog.objects.create(
        wallet=wallet,
        tenant_id=wallet.tenant_id,
        action=KeyLogAction.CREATED,
        key_id=issued.key.key_id,
        actor_key_id=actor_key_id,
    )
    audit_record(
        event="api_key.created",
        ok=True,
        tenant_id=wallet.tenant_id,
        wallet_id=wallet.wallet_id,
        key_id=actor_key_id or None,
        endpoint="/v1/api-keys",
        detail={"new_key_id": issued.key.key_id, **({"actor": actor} if actor else {})},
    )
    return issued


@transaction.atomic(durable=True)
def operator_key_create(*, name: str = "operator", actor: str = "") -> IssuedKey:
    """Create an operator key (no wallet). Only ``manage.py`` and the admin console call this."""
    issued = _new_key(wallet=None, name=name)
    audit_record(
        event="api_key.operator_created",
        ok=True,
        detail={"new_key_id": issued.key.key_id, **({"actor": actor} if actor else {})},
    )
    return issued


@transaction.atomic(durable=True)
def operator_key_revoke(*, key_id: str, reason: str = "operator_console", actor: str = "") -> APIKey:
    """Revoke an operator key (the console), audited on the system chain. Revoking a revoked key changes nothing."""
    key = APIKey.objects.select_for_update(no_key=True).filter(key_id=key_id, wallet__isnull=True).first()
    if key is None:
        raise NotFound("No such operator key.", key_id=key_id)
    if _revoke(key, reason):
        audit_record(
            event="api_key.operator_revoked",
            ok=True,
            detail={"revoked_key_id": key.key_id, "reason": reason, **({"actor": actor} if actor else {})},
        )
    return key


def _lock_wallet(wallet: Wallet) -> None:
    Wallet.objects.select_for_update(no_key=True, of=("self",)).filter(wallet_id=wallet.wallet_id).first()


def _lock_key(wallet: Wallet, key_id: str) -> APIKey:
    key = APIKey.objects.select_for_update(no_key=True).filter(key_id=key_id, wallet=wallet).first()
    if key is None:
        raise NotFound("No such API key in this wallet.", key_id=key_id)
    return key


def _require_active_minter(actor_key_id: str) -> None:
    """The key minting another must still be active (its row locked against a concurrent revocation)."""
    if not actor_key_id:
        return
    minter = APIKey.objects.select_for_update(no_key=True).filter(key_id=actor_key_id).first()
    if minter is not None and minter.status != APIKeyStatus.ACTIVE:
        from config.errors import InvalidAPIKey

        raise InvalidAPIKey(key_id=actor_key_id)


LINEAGE_SQL = """
WITH RECURSIVE lineage(key_id) AS (
    SELECT k.key_id FROM billing_api_key AS k
     WHERE (k.created_by_key_id = ANY(%(roots)s) OR k.rotated_from = ANY(%(roots)s))
       AND NOT k.key_id = ANY(%(exclude)s)
    UNION
    SELECT k.key_id FROM billing_api_key AS k
      JOIN lineage AS l ON k.created_by_key_id = l.key_id OR k.rotated_from = l.key_id
     WHERE NOT k.key_id = ANY(%(exclude)s)
)
SELECT key_id FROM lineage
"""


def _revoke_lineage(*, roots: list[APIKey], reason: str, actor_key_id: str, exclude: tuple[str, ...] = ()) -> list[str]:
    """Revoke every active key minted, directly or transitively, by the wallet keys in ``roots``.

    A key's lineage follows who minted it (``created_by_key_id``) and what it replaced
    (``rotated_from``), so an agent cannot outlive its own revocation by minting or
    rotating keys first. Keys minted by an operator key or the console start a lineage
    of their own (revoking an operator key does not revoke the tenants it provisioned).
    ``exclude`` keeps a rotation's successor. Each revocation is logged in its wallet's
    key log (reason ``lineage: ...``), alerted and audited. Caller holds the transaction.
    """
    wallet_roots = [key.key_id for key in roots if key.wallet_id is not None]
    if not wallet_roots:
        return []
    with connection.cursor() as cursor:
        cursor.execute(LINEAGE_SQL, {"roots": wallet_roots, "exclude": list(exclude)})
        lineage = [row[0] for row in cursor.fetchall()]
    keys = list(
        APIKey.objects.select_for_update(no_key=True, of=("self",))
        .select_related("wallet")
        .filter(key_id__in=lineage, status=APIKeyStatus.ACTIVE)
        .order_by("key_id")
    )
    revoked = []
    for key in keys:
        cause = key.created_by_key_id if key.created_by_key_id in wallet_roots else key.rotated_from
        lineage_reason = f"lineage: minted under revoked key {cause or ', '.join(wallet_roots)} ({reason})"[:200]
        if not _revoke(key, lineage_reason):
            continue
        revoked.append(key.key_id)
        assert key.wallet is not None
        _record_revocation(
            key,
            key.wallet,
            reason=lineage_reason,
            actor_key_id=actor_key_id,
            message=f"API key {key.key_id} was revoked with the key that minted it.",
            endpoint="/v1/api-keys",
            created_by_key_id=key.created_by_key_id,
            rotated_from=key.rotated_from,
        )
    return revoked


def _record_revocation(
    key: APIKey,
    wallet: Wallet,
    *,
    reason: str,
    actor_key_id: str,
    message: str,
    endpoint: str,
    actor: str = "",
    **detail: Any,
) -> None:
    """A key's revocation in its wallet's key log, an alert and an audit event. Caller holds the transaction."""
    KeyRotationLog.objects.create(
        wallet=wallet,
        tenant_id=wallet.tenant_id,
        action=KeyLogAction.REVOKED,
        key_id=key.key_id,
        reason=reason,
        actor_key_id=actor_key_id,
    )
    alert_raise(
        tenant_id=wallet.tenant_id,
        wallet_id=wallet.wallet_id,
        kind="api_key_revoked",
        message=message,
        detail={"key_id": key.key_id, "reason": reason},
    )
    audit_record(
        event="api_key.revoked",
        ok=True,
        tenant_id=wallet.tenant_id,
        wallet_id=wallet.wallet_id,
        key_id=actor_key_id or None,
        endpoint=endpoint,
        detail={"revoked_key_id": key.key_id, "reason": reason, **detail, **({"actor": actor} if actor else {})},
    )


def _revoke(key: APIKey, reason: str) -> bool:
    if key.status == APIKeyStatus.REVOKED:
        return False
    key.status = APIKeyStatus.REVOKED
    key.revoked_at = timezone.now()
    key.revoke_reason = reason
    key.save(update_fields=["status", "revoked_at", "revoke_reason"])
    return True


@transaction.atomic(durable=True)
def api_key_rotate(
    *, wallet: Wallet, key_id: str, revoke_old: bool = True, reason: str = "rotation", actor_key_id: str = ""
) -> IssuedKey:
    """Create a successor for ``key_id``; optionally revoke the old key in the same transaction."""
    old = _lock_key(wallet, key_id)
    if old.status != APIKeyStatus.ACTIVE:
        from config.errors import Conflict

        raise Conflict("A revoked key cannot be rotated.", key_id=key_id)
    _require_active_minter(actor_key_id)
    issued = _new_key(wallet=wallet, name=old.name, rotated_from=old.key_id, actor_key_id=actor_key_id)
    if revoke_old:
        _revoke(old, reason)
        _revoke_lineage(roots=[old], reason=reason, actor_key_id=actor_key_id, exclude=(issued.key.key_id,))
    KeyRotationLog.objects.create(
        wallet=wallet,
        tenant_id=wallet.tenant_id,
        action=KeyLogAction.ROTATED,
        key_id=old.key_id,
        new_key_id=issued.key.key_id,
        reason=reason,
        actor_key_id=actor_key_id,
    )
    if revoke_old:
        alert_raise(
            tenant_id=wallet.tenant_id,
            wallet_id=wallet.wallet_id,
            kind="api_key_revoked",
            severity="info",
            message=f"API key {old.key_id} was revoked by rotation to {issued.key.key_id}.",
            detail={"key_id": old.key_id, "new_key_id": issued.key.key_id, "reason": reason},
        )
    audit_record(
        event="api_key.rotated",
        ok=True,
        tenant_id=wallet.tenant_id,
        wallet_id=wallet.wallet_id,
        key_id=actor_key_id or None,
        endpoint="/v1/api-keys/rotate",
        detail={"old_key_id": old.key_id, "new_key_id": issued.key.key_id, "old_revoked": revoke_old},
    )
    return issued


@transaction.atomic(durable=True)
def api_key_revoke(
    *, wallet: Wallet, key_id: str, reason: str = "user_request", actor_key_id: str = "", actor: str = ""
) -> APIKey:
    """Revoke one key immediately and for good, with every key it minted (``_revoke_lineage``).

    Revoking a revoked key changes nothing but still sweeps its lineage, so a key that
    slipped through (minted by a key revoked before lineage was enforced) goes too.
    """
    key = _lock_key(wallet, key_id)
    revoked_now = _revoke(key, reason)
    _revoke_lineage(roots=[key], reason=reason, actor_key_id=actor_key_id)
    if revoked_now:
        _record_revocation(
            key,
            wallet,
            reason=reason,
            actor_key_id=actor_key_id,
            actor=actor,
            message=f"API key {key.key_id} was revoked ({reason}).",
            endpoint="/v1/api-keys/{wallet_id}/{key_id}",
        )
    return key


@transaction.atomic(durable=True)
def api_key_emergency_revoke(
    *, wallet: Wallet, reason: str = "emergency", actor_key_id: str = "", actor: str = ""
) -> list[str]:
    """Revoke every active key of ``wallet`` and of every wallet below it at once, with their lineage.

    Returns the ids revoked now. Holds the wallet row lock, which key creation also
    takes, and locks every key it revokes (a key minting concurrently waits on its own
    row), so no key created concurrently can survive the revocation.
    """
    _lock_wallet(wallet)
    keys = list(
        APIKey.objects.select_for_update(no_key=True, of=("self",))
        .select_related("wallet")
        .filter(wallet__path__startswith=wallet.path, tenant_id=wallet.tenant_id, status=APIKeyStatus.ACTIVE)
        .order_by("key_id")
    )
    revoked = [k.key_id for k in keys if _revoke(k, reason)]
    for key in keys:
        if key.key_id not in revoked:
            continue
        assert key.wallet is not None
        KeyRotationLog.objects.create(
            wallet=key.wallet,
            tenant_id=wallet.tenant_id,
            action=KeyLogAction.EMERGENCY_REVOKED,
            key_id=key.key_id,
            reason=reason if key.wallet_id == wallet.wallet_id else f"{reason} (wallet {wallet.wallet_id})"[:200],
            actor_key_id=actor_key_id,
        )
    revoked += _revoke_lineage(roots=keys, reason=reason, actor_key_id=actor_key_id)
    alert_raise(
        tenant_id=wallet.tenant_id,
        wallet_id=wallet.wallet_id,
        kind="api_keys_emergency_revoked",
        severity="critical",
        message=f"All {len(revoked)} active API keys of the wallet and the wallets below it were revoked ({reason}).",
        detail={"key_ids": revoked, "reason": reason},
    )
    audit_record(
        event="api_key.emergency_revoked",
        ok=True,
        tenant_id=wallet.tenant_id,
        wallet_id=wallet.wallet_id,
        key_id=actor_key_id or None,
        endpoint="/v1/api-keys/emergency-revoke",
        detail={"revoked_key_ids": revoked, "reason": reason, **({"actor": actor} if actor else {})},
    )
    return revoked


# --- Ledger building blocks (caller holds the transaction) ------------------------------

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


def wallet_check_may_spend(*, wallet: Wallet) -> None:
    """The status controls alone (closed, frozen, expired: 403), for calls that cost nothing.

    Reads the wallet's current row and its ancestors'; a zero-priced tool call must
    still be refused to a frozen, expired or closed wallet, or to one below such a wallet.
    """
    current = Wallet.objects.get(pk=wallet.pk)
    _check_may_spend(current)
    _check_line_may_spend(current)


def _check_may_spend(wallet: Wallet) -> None:
    """Status controls: closed, frozen and expired wallets spend nothing (403)."""
    if wallet.status == WalletStatus.CLOSED:
        raise WalletClosed(wallet_id=wallet.wallet_id)
    if wallet.status == WalletStatus.FROZEN:
        raise WalletFrozen(wallet_id=wallet.wallet_id, frozen_reason=wallet.frozen_reason)
    if wallet.is_expired:
        raise WalletExpired(wallet_id=wallet.wallet_id)


def _check_line_may_spend(wallet: Wallet) -> None:
    """A freeze covers the subtree: refuse (403) when any ancestor is frozen, expired or closed.

    The refusal names the ancestor that stops the wallet (the debit applies the same
    rule in ``billing_debit``).
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
        _check_may_spend(Wallet.objects.get(wallet_id=blocked_id))


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
    Returns (source entry, target entry).
    """
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
                "ON CONFLICT (wallet_id, hour) DO UPDATE SET amount = billing_spend_bucket.amount + EXCLUDED.amount",
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
    """One round trip: ``billing_debit`` (billing/migrations/0008) with ``call``'s arguments.

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
    billing/migrations/0008_debit_function.py). Raises ``WalletClosed``,
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


# --- Wallets ---------------------------------------------------------------------------


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
    _check_may_spend(locked_parent)
    _check_line_may_spend(locked_parent)
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
    _check_may_spend(locked_source)
    _check_line_may_spend(locked_source)
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

    Refused (409) while the wallet has child wallets that are not closed.
    Locks the parent before the wallet. Closing a closed wallet changes nothing.
    """
    parent = _lock(wallet.parent_id) if wallet.parent_id else None
    locked = _lock(wallet.wallet_id)
    if locked.status == WalletStatus.CLOSED:
        return locked
    if Wallet.objects.filter(parent=locked).exclude(status=WalletStatus.CLOSED).exists():
        raise WalletHasOpenChildren(wallet_id=locked.wallet_id)
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


# --- Charge ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ChargeOutcome:
    """The HTTP status and body of a charge, and whether they are a replay of a stored response."""

    status: int
    body: dict[str, Any]
    replayed: bool


def charge_request_hash(
    *, wallet_id: str, service_category: str, units: Decimal, request_path: str, description: str
) -> str:
    """SHA-256 of the canonical JSON of the charge's parameters (what an idempotency key binds)."""
    return request_hash(
        {
            "operation": "billing.charge",
            "wallet_id": wallet_id,
            "service_category": service_category,
            "units": money(units),
            "request_path": request_path,
            "description": description,
        }
    )


CHARGE_ENDPOINT = "/v1/billing/charge"
# billing_charge's last arguments: the deferred rate-limit charge (billing.ratelimit), NULLs without one.
_RATE_ARGUMENTS = ("k_key_id", "k_secret_hash", "k_window_index", "k_limit")
# The arguments of billing_charge (billing/sql/billing_charge.sql) in order, with the casts they need.
CHARGE_ARGUMENTS = (
    "p_wallet_id",
    "p_tenant_id",
    "p_reach_wallet_id",
    "p_category",
    "p_default_price",
    "p_units",
    "p_description",
    "p_request_path",
    "p_correlation_id",
    "p_now",
    "p_ids",
    "p_hour_limit",
    "p_day_limit",
    "p_idempotency_key",
    "p_request_hash",
    "p_body",
    "p_key_id",
    "p_endpoint",
    "p_request_id",
    "p_charge_event_id",
    "p_charge_created_at",
    "p_charge_detail",
    "p_charge_parts",
    "p_refill_event_id",
    "p_refill_created_at",
    "p_refill_detail",
    "p_refill_parts",
    *_RATE_ARGUMENTS,
)
_CASTS = {
    "p_ids": "::text[]",
    "p_body": "::jsonb",
    "p_charge_detail": "::jsonb",
    "p_charge_parts": "::bytea[]",
    "p_refill_created_at": "::timestamptz",
    "p_refill_detail": "::jsonb",
    "p_refill_parts": "::bytea[]",
}
# Its answer (OUT parameters): billing_debit's columns, then its own.
CHARGE_COLUMNS = (*DEBIT_COLUMNS, "unit_price", "charged", "response_status", "body", "rate_count")
CHARGE_SQL = (
    f"SELECT {', '.join(CHARGE_COLUMNS)} FROM billing_charge("  # noqa: S608
    + ", ".join(f"%s{_CASTS.get(name, '')}" for name in CHARGE_ARGUMENTS)
    + ")"
)
# billing_charge raises it when the debit posted a refill whose audit event was not prepared.
_REFILL_EVENT_NEEDED = "TGRF1"
# A figure the database writes into an audit event, and its canonical JSON (RFC 8785 escapes the NULs,
# and the key before it anchors it: a quote inside a string is always escaped, so '"key":' followed
# by these bytes occurs only where the detail holds the placeholder).
_LATE = "\x00late\x00"
_LATE_JSON = canonical_bytes_fast(_LATE)


@dataclass(frozen=True)
class LateEvent:
    """An audit event ready for ``billing_charge``, whose ``late`` detail figures the database writes.

    ``parts`` are the event's canonical bytes before its seq, cut where each late value goes
    (in key order, each cut ending with ``"key":``), then the bytes after the seq: the database
    joins them with the values it writes and hands the two halves to ``audit_append``.
    """

    record: AuditEvent
    detail: dict[str, Any]
    parts: list[bytes]


def late_event_prepare(*, late: tuple[str, ...], **fields: Unpack[EventFields]) -> LateEvent:
    """Prepare an event (``audit_event_prepare``) with placeholders for the ``late`` keys of its detail.

    ``detail`` must hold the placeholder ``_LATE`` at each late key, at its top level. The
    canonical bytes are Python's (the one encoder); the database only splices values that are
    canonical by construction (billing/sql/billing_charge.sql).
    """
    prepared = audit_event_prepare(**fields)
    parts: list[bytes] = []
    rest = prepared.prefix
    for key in sorted(late):
        marker = b'"' + key.encode() + b'":'
        head, found, rest = rest.partition(marker + _LATE_JSON)
        if not found or marker + _LATE_JSON in rest:
            raise AssertionError(f"the event's canonical bytes do not hold the placeholder of {key!r} once")
        parts.append(head + marker)
    parts.extend((rest, prepared.suffix))
    detail = {key: value for key, value in prepared.record.detail.items() if key not in late}
    return LateEvent(prepared.record, detail, parts)


def _charge_events(
    *,
    ids: tuple[str, ...],
    wallet_id: str,
    tenant_id: str,
    service_category: str,
    request_path: str,
    actor_key_id: str,
    correlation_id: str,
    refill: bool,
) -> tuple[LateEvent, LateEvent | None]:
    """The ledger.charge event (and ledger.refill with ``refill``), as ``ledger_audit`` writes them."""

    def fields(kind: str, detail: dict[str, Any]) -> EventFields:
        return {
            "event": f"ledger.{kind}",
            "ok": True,
            "tenant_id": tenant_id,
            "wallet_id": wallet_id,
            "key_id": actor_key_id or None,
            "endpoint": CHARGE_ENDPOINT,
            "request_id": correlation_id or None,
            "detail": detail,
        }

    refill_event = None
    if refill:  # prepared first: it is appended first
        kind = LedgerKind.REFILL.value
        refill_event = late_event_prepare(
            late=("amount", "balance_after", "counterparty"),
            **fields(
                kind,
                ledger_event_detail(
                    entry_id=ids[5],
                    transaction_id=ids[3],
                    kind=kind,
                    amount=_LATE,
                    balance_after=_LATE,
                    counterparty=_LATE,
                ),
            ),
        )
    kind = LedgerKind.CHARGE.value
    charge_event = late_event_prepare(
        late=("amount", "balance_after"),
        **fields(
            kind,
            ledger_event_detail(
                entry_id=ids[1],
                transaction_id=ids[0],
                kind=kind,
                amount=_LATE,
                balance_after=_LATE,
                counterparty=SystemAccount.REVENUE.value,
                service_category=service_category,
                request_path=request_path,
            ),
        ),
    )
    return charge_event, refill_event


def wallet_charge(
    *,
    wallet: Wallet | str,
    service_category: str = ServiceCategory.OTHER,
    units: Decimal | int = 1,
    request_path: str = "",
    description: str = "",
    idempotency_key: str | None = None,
    actor_key_id: str = "",
    correlation_id: str = "",
    caller: Principal | None = None,
    deferred: DeferredCharge | None = None,
) -> ChargeOutcome:
    """Charge ``price(service_category) * units`` from ``wallet`` to revenue (POST /v1/billing/charge).

    One statement, ``billing_charge`` (billing/sql/billing_charge.sql), which in autocommit is its
    own transaction: the wallet's reach, the idempotency record, the price, the debit
    (``billing_debit``), the record's insert and the audit events. Idempotent per (wallet,
    ``idempotency_key``) as the module docstring describes; a refused charge writes nothing. On a
    velocity refusal, commits the freeze in a second transaction before the refusal propagates.

    With ``caller`` (the API), a wallet key must reach the wallet (403 ``wallet_access_denied``,
    also for an unknown wallet) and an operator gets 404 for an unknown wallet, as
    ``selectors.wallet_for_caller`` answers; without it the caller has checked access.
    Owns its transaction: refuses to run inside another one (tests' transactions excepted).

    With ``deferred`` (the API, for a key the process authenticated before), the statement also
    checks the key and charges its rate-limit window (``billing.ratelimit``); past the limit it
    raises ``DeferredRefused`` with nothing charged, and a key that no longer checks out is charged
    on the rate limiter's path (which may refuse it) before the charge runs without it.
    """
    _require_own_transaction("wallet_charge")
    wallet_id = wallet.wallet_id if isinstance(wallet, Wallet) else wallet
    reach = caller.wallet_id if caller is not None and not caller.is_operator else None
    if reach is not None:
        tenant_id = caller.tenant_id if caller is not None else None  # the wallet must be in the key's tenant
    elif isinstance(wallet, Wallet):
        tenant_id = wallet.tenant_id
    else:  # an operator: the tenant (the events' chain) comes from the wallet
        tenant_id = Wallet.objects.filter(wallet_id=wallet_id).values_list("tenant_id", flat=True).first()
        if tenant_id is None:
            raise NotFound("No such wallet.", wallet_id=wallet_id)
    if tenant_id is None:
        raise WalletAccessDenied(wallet_id=wallet_id)
    call = charge_call(
        wallet_id=wallet_id,
        tenant_id=tenant_id,
        reach_wallet_id=reach,
        service_category=service_category,
        units=to_money(Decimal(units)),
        request_path=request_path,
        description=description,
        idempotency_key=idempotency_key,
        actor_key_id=actor_key_id,
        correlation_id=correlation_id,
    )
    if deferred is not None and not deferred.settled:
        key_id, digest, window_index, limit = deferred.claim_params()
        call = dataclasses.replace(call, rate=(key_id, digest, window_index, limit))
    try:
        try:
            return _charge(call, deferred)
        except _KeyStale:
            assert deferred is not None
            deferred.fresh_key()  # charged as at the request's start (DeferredRefused when refused)
            return _charge(dataclasses.replace(call, rate=None))
    except VelocityLimitExceeded as exc:
        wallet_freeze_for_velocity(exc=exc, actor_key_id=actor_key_id)
        raise


def _require_own_transaction(name: str) -> None:
    """What ``transaction.atomic(durable=True)`` checks, for a service that is one statement in autocommit."""
    blocks = connection.atomic_blocks
    if blocks and not getattr(blocks[-1], "_from_testcase", False):
        raise RuntimeError(f"{name} owns its transaction; it cannot run inside another one")


def _bytea_array(parts: list[bytes]) -> str:
    """``parts`` as a PostgreSQL ``bytea[]`` literal (quoted hex elements).

    psycopg adapts a Python list element by element in Python, which cost more CPU than the rest
    of the charge's arguments together; the literal is one string, parsed by the server.
    """
    return "{" + ",".join('"\\\\x' + part.hex() + '"' for part in parts) + "}"


@dataclass(frozen=True)
class ChargeCall:
    """One prepared call of ``billing_charge``: what only Python does (ids, time, hash, body, events).

    ``arguments`` gives the function's arguments by name (``CHARGE_ARGUMENTS`` order), preparing
    the audit events' canonical bytes; the ledger.refill event only with ``refill_event``.
    """

    wallet_id: str
    tenant_id: str
    reach_wallet_id: str | None
    service_category: str
    units: Decimal
    description: str
    request_path: str
    correlation_id: str
    idempotency_key: str | None
    request_hash: str
    actor_key_id: str
    now: datetime
    ids: tuple[str, str, str, str, str, str]
    body: dict[str, Any]
    # The deferred rate-limit charge's key, secret digest, window and limit (billing.ratelimit), or None.
    rate: tuple[str, str, int, int] | None = None

    def arguments(self, *, refill_event: bool) -> dict[str, Any]:
        """``billing_charge``'s arguments by name; each call prepares the events anew (new event ids)."""
        charge, refill = _charge_events(
            ids=self.ids,
            wallet_id=self.wallet_id,
            tenant_id=self.tenant_id,
            service_category=self.service_category,
            request_path=self.request_path,
            actor_key_id=self.actor_key_id,
            correlation_id=self.correlation_id,
            refill=refill_event,
        )
        event = charge.record
        return {
            "p_wallet_id": self.wallet_id,
            "p_tenant_id": self.tenant_id,
            "p_reach_wallet_id": self.reach_wallet_id,
            "p_category": self.service_category,
            "p_default_price": DEFAULT_CATEGORY_PRICES.get(self.service_category),
            "p_units": self.units,
            "p_description": self.description,
            "p_request_path": self.request_path,
            "p_correlation_id": self.correlation_id,
            "p_now": self.now,
            "p_ids": "{" + ",".join(self.ids) + "}",  # ids are [A-Za-z0-9_]: an array literal needs no quoting
            "p_hour_limit": VELOCITY_HOUR_LIMIT,
            "p_day_limit": VELOCITY_DAY_LIMIT,
            "p_idempotency_key": self.idempotency_key,
            "p_request_hash": self.request_hash,
            "p_body": json.dumps(self.body),
            "p_key_id": event.key_id,
            "p_endpoint": event.endpoint,
            "p_request_id": event.request_id,
            "p_charge_event_id": event.event_id,
            "p_charge_created_at": event.created_at,
            "p_charge_detail": json.dumps(charge.detail),
            "p_charge_parts": _bytea_array(charge.parts),
            "p_refill_event_id": None if refill is None else refill.record.event_id,
            "p_refill_created_at": None if refill is None else refill.record.created_at,
            "p_refill_detail": None if refill is None else json.dumps(refill.detail),
            "p_refill_parts": None if refill is None else _bytea_array(refill.parts),
            **dict(zip(_RATE_ARGUMENTS, self.rate or (None,) * 4, strict=True)),
        }


def charge_call(
    *,
    wallet_id: str,
    tenant_id: str,
    reach_wallet_id: str | None,
    service_category: str,
    units: Decimal,
    request_path: str,
    description: str,
    idempotency_key: str | None,
    actor_key_id: str = "",
    correlation_id: str = "",
) -> ChargeCall:
    """Prepare a charge of ``units`` (positive, at 8 places) of ``service_category`` from ``wallet_id``.

    ``tenant_id`` is the wallet's tenant (the chain its events go to); ``reach_wallet_id`` a
    wallet key's own wallet, which the charged wallet must be or descend from (None: not checked).
    """
    from billing.serializers import charge_response_template

    request_hash_ = charge_request_hash(
        wallet_id=wallet_id,
        service_category=service_category,
        units=units,
        request_path=request_path,
        description=description,
    )
    now = timezone.now()
    ids = (new_id("ltx"), new_id("led"), new_id("led"), new_id("ltx"), new_id("led"), new_id("led"))
    description, request_path = description[:500], request_path[:300]
    correlation_id = (correlation_id or get_request_id() or "")[:128]
    return ChargeCall(
        wallet_id=wallet_id,
        tenant_id=tenant_id,
        reach_wallet_id=reach_wallet_id,
        service_category=service_category,
        units=units,
        description=description,
        request_path=request_path,
        correlation_id=correlation_id,
        idempotency_key=idempotency_key,
        request_hash=request_hash_,
        actor_key_id=actor_key_id,
        now=now,
        ids=ids,
        body=charge_response_template(
            entry_id=ids[1],
            transaction_id=ids[0],
            wallet_id=wallet_id,
            service_category=service_category,
            units=units,
            description=description,
            request_path=request_path,
            correlation_id=correlation_id,
            idempotency_key=idempotency_key,
            created_at=now,
        ),
    )


class _KeyStale(Exception):  # an internal signal, never answered
    """The deferred rate-limit charge's key no longer checks out: nothing was written."""


def _charge(call: ChargeCall, deferred: DeferredCharge | None = None) -> ChargeOutcome:
    """``call`` in one round trip, and its answer as an outcome or as today's exception.

    With ``call.rate``, reports the window's count to ``deferred`` (``DeferredRefused`` past the
    limit, ``_KeyStale`` when the key no longer checks out).

    The ledger.refill event is prepared only when the database asks for it (SQLSTATE TGRF1: the
    statement rolled back whole) or inside a caller's transaction, where a failed statement
    would abort the transaction.
    """
    refill_event = connection.in_atomic_block
    while True:
        params = list(call.arguments(refill_event=refill_event).values())
        try:
            # A batch carries one key's deferred charges at most (billing_charge: a later charge locks no new row).
            group = call.wallet_id if call.rate is None else f"{call.wallet_id} {call.rate[0]}"
            row = _charge_row(params) if connection.in_atomic_block else _charge_row_grouped(group, params)
        except DatabaseError as exc:
            if refill_event or getattr(exc.__cause__, "sqlstate", None) != _REFILL_EVENT_NEEDED:
                raise
            refill_event = True
            continue
        if call.rate is not None:
            assert deferred is not None
            if row["code"] == "key_stale":
                raise _KeyStale()
            deferred.claimed(int(row["rate_count"]))
            if row["code"] == "rate_limited":
                raise DeferredRefused()
        return _charge_outcome(row, call)


def _charge_row(params: list[Any]) -> dict[str, Any]:
    """``billing_charge``'s answer to ``params``: one statement (its own transaction in autocommit)."""
    row = fastsql.fetch_row(CHARGE_SQL, params)
    assert row is not None
    return dict(zip(CHARGE_COLUMNS, row, strict=True))


# Group commit. A durable commit waits for the WAL flush, and the wallet's row lock (and the
# tenant's chain head) are held until it ends, so one wallet's charges serialize on the flush:
# with a flush of 1-2 ms, a few hundred charges per second whatever the CPU. Charges of one wallet
# that arrive while another charge of it is in flight in this process wait and then go together:
# one statement that calls billing_charge once per charge (so one transaction, one round trip, one
# flush, and no lock held while this process gets its next message ready). Each charge is still
# its own billing_charge call, in arrival order, seeing the ones before it. The lock order holds:
# a charge after the first of a batch runs with the chain head held and locks nothing new (the
# same wallet and agent ancestors), and billing_charge refuses one that might lock an
# auto-refill's parent (TGBT1), so such a wallet's charges run alone.
CHARGE_BATCH_MAX = 16
# A wallet with an auto-refill cannot have a second charge in a batch (billing_charge refuses it,
# SQLSTATE TGBT1: its parent's lock would come after the chain head); after such a refusal its
# charges go one statement at a time in this process for this long.
UNBATCHED_SECONDS = 300.0
_BATCH_REFUSED = "TGBT1"


@dataclass(eq=False)
class _QueuedCharge:
    """A charge waiting for the statement that carries it: its arguments, then its answer."""

    params: list[Any]
    ready: threading.Event = field(default_factory=threading.Event)
    row: dict[str, Any] | None = None
    error: BaseException | None = None
    batch: list[_QueuedCharge] | None = None  # set when this charge's thread is to run the next batch


_charge_queues: dict[str, list[_QueuedCharge]] = {}  # wallet id -> charges waiting while a batch of it runs
_charge_queues_lock = threading.Lock()
_unbatched: dict[str, float] = {}  # wallet id -> monotonic time until which its charges run alone


def _charge_row_grouped(wallet_id: str, params: list[Any]) -> dict[str, Any]:
    """``billing_charge``'s answer to ``params``, committed with the wallet's other charges waiting here.

    The first charge of an idle wallet runs at once (alone: no wait, no batching cost). Charges
    arriving while it runs queue; when it ends, the first of them runs the queue (at most
    ``CHARGE_BATCH_MAX``) as one batch in its own thread and connection, and hands the rest on.
    Answers and errors reach each charge's own thread. Assumes autocommit (no atomic block).
    """
    until = _unbatched.get(wallet_id)
    if until is not None:
        if time.monotonic() < until:
            return _charge_row(params)
        _unbatched.pop(wallet_id, None)
    mine = _QueuedCharge(params)
    with _charge_queues_lock:
        waiting = _charge_queues.get(wallet_id)
        if waiting is None:
            _charge_queues[wallet_id] = []
        else:
            waiting.append(mine)
    if waiting is None:
        _charge_batch(wallet_id, [mine])
    else:
        mine.ready.wait()
        if mine.batch is not None:
            _charge_batch(wallet_id, mine.batch)
    if mine.error is not None:
        raise mine.error
    assert mine.row is not None
    return mine.row


def _charge_batch(wallet_id: str, batch: list[_QueuedCharge]) -> None:
    """Run ``batch`` (this thread's charge first), answer every charge in it, hand the queue on."""
    try:
        for queued, answer in zip(batch, _charge_rows(wallet_id, [queued.params for queued in batch]), strict=True):
            if isinstance(answer, BaseException):
                queued.error = answer
            else:
                queued.row = answer
    except BaseException as exc:  # handed to every charge of the batch, raised in each one's thread
        for queued in batch:
            queued.error = exc
    finally:
        with _charge_queues_lock:
            waiting = _charge_queues[wallet_id]
            following = waiting[:CHARGE_BATCH_MAX]
            del waiting[:CHARGE_BATCH_MAX]
            if not following:
                del _charge_queues[wallet_id]
        for queued in batch[1:]:
            queued.ready.set()
        if following:
            following[0].batch = following
            following[0].ready.set()


def _charge_rows(wallet_id: str, calls: list[list[Any]]) -> Sequence[dict[str, Any] | DatabaseError]:
    """The answers to ``calls`` (charges of ``wallet_id``), in order: together in one statement, else
    (it failed) one by one.

    A batch that fails wrote nothing (its statement rolled back whole: a deadlock, a refill event
    to prepare, a second charge of a wallet with an auto-refill, any error of one charge), so each
    charge then runs on its own and gets its own answer or error.
    """
    if len(calls) > 1:
        try:
            return _charge_rows_together(calls)
        except DatabaseError as exc:
            if getattr(exc.__cause__, "sqlstate", None) == _BATCH_REFUSED:
                _unbatched[wallet_id] = time.monotonic() + UNBATCHED_SECONDS
    answers: list[dict[str, Any] | DatabaseError] = []
    for params in calls:
        try:
            answers.append(_charge_row(params))
        except DatabaseError as exc:
            answers.append(exc)
    return answers


@functools.cache
def _batch_sql(size: int) -> str:
    """One statement of ``size`` ``billing_charge`` calls, run in order (the branches of a UNION ALL), each
    after the first with ``p_batch_later``; its rows answer them in the same order. Its placeholders are
    numbered (``fastsql.fetch_all_numbered``): a batch has more parameters than psycopg's parse cache takes."""
    width = len(CHARGE_ARGUMENTS)
    columns = ", ".join(f"c.{column}" for column in CHARGE_COLUMNS)
    calls = " UNION ALL ".join(
        f"SELECT {n} AS n, {columns} FROM billing_charge("  # noqa: S608
        + ", ".join(f"${n * width + i + 1}{_CASTS.get(name, '')}" for i, name in enumerate(CHARGE_ARGUMENTS))
        + f", p_batch_later => {'true' if n else 'false'}) c"
        for n in range(size)
    )
    return f"SELECT {', '.join(CHARGE_COLUMNS)} FROM ({calls}) batch ORDER BY n"  # noqa: S608


def _charge_rows_together(calls: list[list[Any]]) -> list[dict[str, Any]]:
    """Several ``billing_charge`` calls in one statement: one transaction, one round trip."""
    rows = fastsql.fetch_all_numbered(_batch_sql(len(calls)), [value for params in calls for value in params])
    assert len(rows) == len(calls)
    return [dict(zip(CHARGE_COLUMNS, row, strict=True)) for row in rows]


def _charge_outcome(row: dict[str, Any], call: ChargeCall) -> ChargeOutcome:
    """The outcome ``billing_charge`` answered, or its refusal raised as today's exception."""
    code = row["code"]
    if code in ("ok", "replay"):
        from billing.serializers import charge_response_in_order

        body = charge_response_in_order(json.loads(row["body"]))
        return ChargeOutcome(status=row["response_status"], body=body, replayed=code == "replay")
    if code == "idempotency_key_reused":
        raise IdempotencyKeyReused()
    if code == "idempotency_key_in_progress":
        raise IdempotencyKeyInProgress(headers={"Retry-After": "1"})
    if code == "access_denied" or (code == "not_found" and call.reach_wallet_id is not None):
        raise WalletAccessDenied(wallet_id=call.wallet_id)
    if code == "unknown_category":
        raise NotFound("No such service category.", service_category=call.service_category)
    if code == "amount_too_small":
        raise RequestValidationError.single(
            ["query", "units"],
            f"The charge amount (price {money(row['unit_price'])} x units {money(call.units)}) "
            "is zero at 8 decimal places.",
            "amount_too_small",
        )
    refusal = _refusal(row, row["charged"])
    assert refusal is not None
    raise refusal


# --- Prices ----------------------------------------------------------------------------


@transaction.atomic(durable=True)
def category_price_set(
    *, category: str, credits_per_unit: Decimal, actor_key_id: str = "", actor: str = ""
) -> ServicePrice:
    """Set the credits per unit of a service category (audited on the system chain)."""
    if category not in ServiceCategory.values:
        raise NotFound("No such service category.", service_category=category)
    price = to_money(credits_per_unit)
    if price < 0:
        raise RequestValidationError.single(["body", "credits_per_unit"], "Must be 0 or more.", "greater_than_equal")
    row, _ = ServicePrice.objects.update_or_create(category=category, defaults={"credits_per_unit": price})
    audit_record(
        event="pricing.category_price_set",
        ok=True,
        key_id=actor_key_id or None,
        detail={"service_category": category, "credits_per_unit": money(price), **({"actor": actor} if actor else {})},
    )
    return row


@transaction.atomic  # not durable: the console's delete view runs inside its own transaction
def tool_price_remove(*, tool: str, actor_key_id: str = "", actor: str = "") -> bool:
    """Remove ``tool``'s price (the tool is no longer callable or listed in the pricing table), audited.

    Returns False when there was no price.
    """
    deleted, _ = ToolPrice.objects.filter(tool=tool).delete()
    if deleted:
        audit_record(
            event="pricing.tool_price_removed",
            ok=True,
            key_id=actor_key_id or None,
            tool=tool,
            detail={**({"actor": actor} if actor else {})},
        )
    return bool(deleted)


@transaction.atomic(durable=True)
def tool_price_set(*, tool: str, credits: Decimal | None, actor_key_id: str = "", actor: str = "") -> ToolPrice:
    """Set the credits per call of ``tool`` (None: price not set). Quotes and the gateway read it.

    Audited on the system chain.
    """
    tool = tool.strip()
    if not tool or len(tool) > 200:
        raise RequestValidationError.single(["body", "tool"], "A tool name of 1 to 200 characters.", "string_length")
    price = None if credits is None else to_money(credits)
    if price is not None and price < 0:
        raise RequestValidationError.single(["body", "credits"], "Must be 0 or more.", "greater_than_equal")
    row, _ = ToolPrice.objects.update_or_create(tool=tool, defaults={"credits": price})
    audit_record(
        event="pricing.tool_price_set",
        ok=True,
        key_id=actor_key_id or None,
        tool=tool,
        detail={"credits": money(price) if price is not None else None, **({"actor": actor} if actor else {})},
    )
    return row
