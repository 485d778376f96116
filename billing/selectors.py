"""Billing reads, each with the caller's permission scope applied. The caller (``Principal``) is
access's; the reach rule it carries is here (``scope_to_caller``), given to access at start-up
(``billing.apps``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import models
from django.db.models import OuterRef, Q, QuerySet, Subquery, Sum, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from access.selectors import Principal
from access.wallets import KeyWallet, WalletDirectory
from billing.exceptions import WalletClosed
from billing.models import (
    DEFAULT_CATEGORY_PRICES,
    ZERO,
    LedgerEntry,
    ServiceCategory,
    ServicePrice,
    SpendBucket,
    ToolPrice,
    Wallet,
    WalletStatus,
)
from common import fastsql
from common.errors import NotFound, WalletAccessDenied

MONEY_FIELD = models.DecimalField(max_digits=20, decimal_places=8)
ZERO_DEC = Value(ZERO, output_field=MONEY_FIELD)


def wallet_directory() -> WalletDirectory:
    """What access reads of wallets (``access.wallets``): the wallet table's columns for the key
    lookup's join, one wallet by id, and the ids a caller reaches (``wallets_visible``)."""
    return WalletDirectory(
        columns=lambda alias: fastsql.columns(Wallet, alias),
        width=fastsql.width(Wallet),
        from_row=lambda row: fastsql.instance(Wallet, row),
        get=lambda wallet_id: Wallet.objects.filter(wallet_id=wallet_id).first(),
        ids_in_reach=lambda principal: wallets_visible(principal).values("wallet_id"),
        for_caller=lambda principal, wallet_id: wallet_for_caller(principal, wallet_id),
        lock=_wallet_lock,
        require_open=_wallet_require_open,
        subtree_ids=_wallet_subtree_ids,
        choices=lambda: Wallet.objects.exclude(status=WalletStatus.CLOSED),
    )


def _wallet_lock(wallet_id: str) -> Wallet | None:
    """The wallet's row locked (the lock closing and emergency revocation take), as it now reads."""
    return Wallet.objects.select_for_update(no_key=True, of=("self",)).filter(wallet_id=wallet_id).first()


def _wallet_require_open(wallet: KeyWallet) -> None:
    """No key is minted for a closed wallet (403 ``wallet_closed``).

    Closing needs every child closed first, so a wallet below a closed one is closed itself.
    A frozen or expired wallet still gets keys: a freeze is a spend control, and its remedy
    after a leaked key (a velocity freeze) is to rotate that key; nothing it mints can spend.
    """
    if wallet.status == WalletStatus.CLOSED:
        raise WalletClosed("A closed wallet gets no new API keys.", wallet_id=wallet.wallet_id)


def _wallet_subtree_ids(wallet: KeyWallet) -> QuerySet[Wallet, str]:
    """The ids of ``wallet`` and every wallet below it, as a subquery."""
    return Wallet.objects.filter(path__startswith=wallet.path, tenant_id=wallet.tenant_id).values_list(
        "wallet_id", flat=True
    )


def caller_wallet(principal: Principal) -> Wallet:
    """A wallet key's wallet, as the key lookup read it with the key (no query): billing's ``Wallet``,
    since billing gives access the reader (``wallet_directory``). Operator keys have none."""
    wallet = principal.key.wallet
    assert isinstance(wallet, Wallet), "a wallet key's wallet"
    return wallet


def wallet_in_reach(principal: Principal, wallet: Wallet) -> bool:
    """Operators reach every wallet; a wallet key reaches its own wallet and its descendants."""
    if principal.is_operator:
        return True
    return wallet.tenant_id == principal.tenant_id and principal.wallet_id in wallet.ancestry


def wallet_for_caller(principal: Principal, wallet_id: str, *, for_update: bool = False) -> Wallet:
    """The wallet addressed by ``wallet_id`` if the caller may act on it.

    Unknown wallet: 404 for operators; for wallet keys 403 ``wallet_access_denied``
    (the same answer as a wallet outside their reach, so existence does not leak).
    """
    qs = Wallet.objects.all()
    if for_update:
        qs = qs.select_for_update(no_key=True, of=("self",))
    wallet = qs.filter(wallet_id=wallet_id).first()
    if wallet is None:
        if principal.is_operator:
            raise NotFound("No such wallet.", wallet_id=wallet_id)
        raise WalletAccessDenied(wallet_id=wallet_id)
    if not wallet_in_reach(principal, wallet):
        raise WalletAccessDenied(wallet_id=wallet_id)
    return wallet


def scope_to_caller(qs: QuerySet[Any], principal: Principal, wallet_path: str = "wallet__path") -> QuerySet[Any]:
    """The object-level authorization rule, for any tenant-owned queryset (docs/architecture.md, the reach rule).

    Operators see everything; a wallet key sees rows of its own tenant whose wallet is its own
    wallet or below it. ``wallet_path`` is the lookup that reaches the row's wallet's ``path``.
    """
    if principal.is_operator:
        return qs
    own = principal.key.wallet
    assert own is not None
    return qs.filter(tenant_id=principal.tenant_id, **{f"{wallet_path}__startswith": own.path})


def wallets_visible(principal: Principal) -> QuerySet[Wallet]:
    """Wallets the caller may see: all for operators; own wallet and descendants for wallet keys."""
    return scope_to_caller(Wallet.objects.all(), principal, wallet_path="path")


# --- Wallet figures, ledger and prices -------------------------------------------------


@dataclass(frozen=True)
class SpendFigures:
    """Net spend counted against one wallet's windows (its own and, for an agent, its subtree's).

    ``last_hour`` covers the current and the previous clock hour, ``last_day`` the
    current hour and the 24 before it: each is a superset of the rolling window it
    stands for (never looser, at most one hour stricter). ``today`` is since 00:00 UTC.
    """

    last_hour: Decimal
    last_day: Decimal
    today: Decimal


def _utc_midnight(now: datetime) -> datetime:
    return now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def spend_hour(moment: datetime) -> datetime:
    """The clock hour (UTC) whose spend bucket ``moment`` falls in."""
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def spend_windows(wallet_ids: list[str], *, now: datetime | None = None) -> dict[str, SpendFigures]:
    """The spend windows of each wallet in ``wallet_ids``: one query over at most 25 buckets each.

    Reads the counters (``SpendBucket``), never the ledger, so the cost does not
    grow with history. Consistent with later debits only while the caller holds
    the row locks of those wallets.
    """
    now = now or timezone.now()
    hour = spend_hour(now)
    previous, day_start, midnight = hour - timedelta(hours=1), hour - timedelta(hours=24), _utc_midnight(now)
    rows = (
        SpendBucket.objects.filter(wallet_id__in=wallet_ids, hour__gte=min(day_start, midnight))
        .values("wallet_id")
        .annotate(
            last_hour=Coalesce(Sum("amount", filter=Q(hour__gte=previous)), ZERO_DEC),
            last_day=Coalesce(Sum("amount", filter=Q(hour__gte=day_start)), ZERO_DEC),
            today=Coalesce(Sum("amount", filter=Q(hour__gte=midnight)), ZERO_DEC),
        )
        .order_by()
    )
    figures = {wallet_id: SpendFigures(ZERO, ZERO, ZERO) for wallet_id in wallet_ids}
    for row in rows:
        figures[row["wallet_id"]] = SpendFigures(row["last_hour"], row["last_day"], row["today"])
    return figures


def wallet_spend(wallet: Wallet, *, now: datetime | None = None) -> SpendFigures:
    """The wallet's spend windows (for an agent, its whole subtree's): see ``spend_windows``."""
    return spend_windows([wallet.wallet_id], now=now)[wallet.wallet_id]


def with_daily_spend(queryset: QuerySet[Wallet], *, now: datetime | None = None) -> QuerySet[Wallet]:
    """Annotate each wallet with ``daily_spent``: net spend since 00:00 UTC today (an agent's includes its subtree)."""
    midnight = _utc_midnight(now or timezone.now())
    spent = (
        SpendBucket.objects.filter(wallet_id=OuterRef("pk"), hour__gte=midnight)
        .order_by()
        .values("wallet_id")
        .annotate(total=Sum("amount"))
        .values("total")
    )
    return queryset.annotate(daily_spent=Coalesce(Subquery(spent, output_field=MONEY_FIELD), ZERO_DEC))


def wallet_detail(principal: Principal, wallet_id: str) -> Wallet:
    """A wallet the caller may see, with ``daily_spent`` set (403/404 as ``wallet_for_caller``)."""
    wallet = wallet_for_caller(principal, wallet_id)
    wallet.daily_spent = wallet_spend(wallet).today  # type: ignore[attr-defined]
    return wallet


def wallets_list(principal: Principal, *, wallet_type: str | None = None) -> QuerySet[Wallet]:
    """Visible wallets, optionally of one type, oldest first, with ``daily_spent``."""
    qs = wallets_visible(principal)
    if wallet_type:
        qs = qs.filter(wallet_type=wallet_type)
    return with_daily_spend(qs.order_by("created_at", "wallet_id"))


def ledger_of_wallet(wallet: Wallet) -> QuerySet[LedgerEntry]:
    """The wallet's ledger entries, newest first (scoped by the wallet's tenant as well)."""
    return LedgerEntry.objects.filter(wallet=wallet, tenant_id=wallet.tenant_id).order_by("-created_at", "-entry_id")


def account_balance(account: str, *, tenant_id: str | None = None) -> Decimal:
    """The balance of any ledger account (wallet id, ``mint`` or ``revenue``) as the sum of its entries."""
    qs = LedgerEntry.objects.filter(account=account)
    if tenant_id is not None:
        qs = qs.filter(tenant_id=tenant_id)
    total = qs.aggregate(total=Sum("amount"))["total"]
    return total if total is not None else ZERO


def price_for_category(category: str) -> Decimal:
    """Credits per unit of ``category``: the price list row, else the built-in default."""
    row = ServicePrice.objects.filter(category=category).values_list("credits_per_unit", flat=True).first()
    if row is not None:
        return row
    if category not in DEFAULT_CATEGORY_PRICES:
        raise NotFound("No such service category.", service_category=category)
    return DEFAULT_CATEGORY_PRICES[category]


def tool_price(tool_name: str) -> Decimal | None:
    """Credits per call of ``tool_name``; None when its price is not set."""
    return ToolPrice.objects.filter(tool=tool_name).values_list("credits", flat=True).first()


def pricing_table() -> dict[str, Any]:
    """Every category price (defaults filled in) and every tool price, for GET /v1/billing/pricing."""
    rows = dict(ServicePrice.objects.values_list("category", "credits_per_unit"))
    categories = [
        {"service_category": c.value, "credits_per_unit": rows.get(c.value, DEFAULT_CATEGORY_PRICES[c.value])}
        for c in ServiceCategory
    ]
    tools = [{"tool": t.tool, "credits_per_call": t.credits} for t in ToolPrice.objects.order_by("tool")]
    return {"unit": "credits", "categories": categories, "tools": tools}


def console_figures(user: Any, now: datetime) -> dict[str, Any]:
    """The console index's billing figure: the ten tenants holding the most credits (``view_wallet``)."""
    if not user.has_perm("billing.view_wallet"):
        return {}
    totals = Wallet.objects.values("tenant_id").annotate(total=Sum("balance")).order_by("-total")[:10]
    names = dict(Wallet.objects.filter(wallet_id__in=[t["tenant_id"] for t in totals]).values_list("pk", "name"))
    return {"tenants": [(t["tenant_id"], names.get(t["tenant_id"], ""), t["total"]) for t in totals]}
