"""Billing reads, each with the caller's permission scope applied."""

from __future__ import annotations

import functools
import hmac
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import models
from django.db.models import OuterRef, Q, QuerySet, Subquery, Sum, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from access.keys import MIN_SECRET_LENGTH, hash_secret, parse_secret
from billing.models import (
    DEFAULT_CATEGORY_PRICES,
    ZERO,
    APIKey,
    APIKeyStatus,
    KeyRotationLog,
    LedgerEntry,
    ServiceCategory,
    ServicePrice,
    SpendBucket,
    ToolPrice,
    Wallet,
)
from common import fastsql
from common.errors import InvalidAPIKey, NotFound, WalletAccessDenied

MONEY_FIELD = models.DecimalField(max_digits=20, decimal_places=8)
ZERO_DEC = Value(ZERO, output_field=MONEY_FIELD)


def api_key_authenticate(*, secret: str) -> APIKey:
    """The active key for a presented secret. Raises InvalidAPIKey (401) otherwise.

    Looks the key up by id and compares SHA-256 digests in constant time.
    """
    key_id = _key_id_of(secret)
    row = fastsql.fetch_row(_key_with_wallet_sql(), [key_id])
    return _verified(row, secret)


def api_key_authenticate_charging(*, secret: str, window_index: int) -> tuple[APIKey, int]:
    """:func:`api_key_authenticate`, and one unit charged to the key's rate-limit window, in one round trip.

    Returns the key and the larger of its windows' counts after the charge. The window rows of
    ``key:<key_id>`` and of its wallet line (``billing.ratelimit``) are charged only when the presented
    secret's digest is the key's and the key is active, so a caller guessing
    secrets for a known key id never spends that key's allowance (it is charged
    to its own address by the rate limiter, as before). Raises InvalidAPIKey
    exactly as :func:`api_key_authenticate` does, having charged nothing.
    """
    key_id = _key_id_of(secret)
    row = fastsql.fetch_row(_key_charge_sql(), [key_id, hash_secret(secret), window_index, key_id])
    key = _verified(row[:-1] if row is not None else None, secret)
    assert row is not None
    if row[-1] is None:
        # The row read active, but the function, reading afresh, refused: the key was revoked (or its
        # secret replaced) while the statement ran. Answered as the key now reads; nothing was charged.
        api_key_authenticate(secret=secret)
        raise InvalidAPIKey("The API key is not valid.", key_id=key.key_id)
    return key, int(row[-1])


def _key_id_of(secret: str) -> str:
    if len(secret) < MIN_SECRET_LENGTH:
        raise InvalidAPIKey("The API key is missing, malformed or too short.")
    key_id = parse_secret(secret)
    if key_id is None:
        raise InvalidAPIKey("The API key is malformed.")
    return key_id


def _verified(row: tuple[Any, ...] | None, secret: str) -> APIKey:
    """The key of a ``_key_with_wallet_sql`` row if ``secret`` is its active secret; InvalidAPIKey otherwise."""
    if row is None:
        raise InvalidAPIKey("The API key is not valid.")
    split = fastsql.width(APIKey)
    key = fastsql.instance(APIKey, row[:split])
    if not hmac.compare_digest(key.secret_hash, hash_secret(secret)):
        raise InvalidAPIKey("The API key is not valid.")
    if key.status != APIKeyStatus.ACTIVE:
        raise InvalidAPIKey("The API key has been revoked.", key_id=key.key_id)
    fastsql.attach(key, "wallet", fastsql.instance(Wallet, row[split:]) if key.wallet_id else None)
    return key


@functools.cache
def _key_with_wallet_sql() -> str:
    """The key and its wallet (NULLs for operator keys) in one precompiled query (every request runs it)."""
    # Column names come from the models' metadata, never from input.
    return (
        f"SELECT {fastsql.columns(APIKey, 'k')}, {fastsql.columns(Wallet, 'w')} "  # noqa: S608
        "FROM billing_api_key k LEFT JOIN billing_wallet w ON w.wallet_id = k.wallet_id WHERE k.key_id = %s"
    )


@functools.cache
def _key_charge_sql() -> str:
    """``_key_with_wallet_sql`` plus one unit on the key's rate-limit window and its wallet line's
    (``billing.ratelimit``), charged by ``billing_rate_limit_key_charge`` (billing/sql), which charges
    only the holder of the key's secret: the count (the larger window's) is NULL when it refused
    (unknown key, wrong secret, revoked key).
    """
    # Column names come from the models' metadata, never from input. One row at most (the key's id is
    # its primary key), so the window is charged at most once.
    return (
        f"SELECT {fastsql.columns(APIKey, 'k')}, {fastsql.columns(Wallet, 'w')}, "  # noqa: S608
        "billing_rate_limit_key_charge(%s, %s, %s, NULL) "
        "FROM billing_api_key k LEFT JOIN billing_wallet w ON w.wallet_id = k.wallet_id WHERE k.key_id = %s"
    )


@dataclass(frozen=True)
class Principal:
    """The authenticated caller: one API key, wallet-scoped or operator.

    Here beside the reach rule it carries (``wallets_visible``); ``billing.authentication``
    puts it on ``request.user``.
    """

    key: APIKey

    @property
    def key_id(self) -> str:
        return self.key.key_id

    @property
    def wallet_id(self) -> str | None:
        return self.key.wallet_id

    @property
    def tenant_id(self) -> str | None:
        return self.key.tenant_id

    @property
    def is_operator(self) -> bool:
        return self.key.wallet_id is None

    def wallet_ids_in_reach(self) -> Any:
        """The ids of the wallets a wallet key reaches (its own and its descendants), as a subquery.

        For apps below billing (audit) that store plain wallet ids and cannot read the tree.
        """
        return wallets_visible(self).values("wallet_id")

    # DRF and Django treat request.user as a user object.
    @property
    def is_authenticated(self) -> bool:
        return True


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


def api_keys_of_wallet(wallet: Wallet) -> QuerySet[APIKey]:
    return APIKey.objects.filter(wallet=wallet).order_by("-created_at", "key_id")


def key_logs_of_wallet(wallet: Wallet) -> QuerySet[KeyRotationLog]:
    return KeyRotationLog.objects.filter(wallet=wallet).order_by("-created_at", "-id")


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
