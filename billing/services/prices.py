"""Prices per service category and per tool; every change owns its transaction and is audited."""

from __future__ import annotations

from decimal import Decimal

from django.db import transaction

from audit.services import audit_record
from billing.exceptions import money
from billing.models import ServiceCategory, ServicePrice, ToolPrice, ToolPriceChange
from billing.services.ledger import to_money
from common.errors import NotFound, RequestValidationError


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
    """Remove ``tool``'s price (the tool is no longer callable or listed in the pricing table), audited
    and kept in the price history (``ToolPriceChange``). Returns False when there was no price."""
    row = ToolPrice.objects.select_for_update().filter(tool=tool).first()
    if row is None:
        return False
    row.delete()
    ToolPriceChange.objects.create(
        tool=tool, old_credits=row.credits, new_credits=None, removed=True, actor=actor, actor_key_id=actor_key_id
    )
    audit_record(
        event="pricing.tool_price_removed",
        ok=True,
        key_id=actor_key_id or None,
        tool=tool,
        detail={
            "old_credits": money(row.credits) if row.credits is not None else None,
            **({"actor": actor} if actor else {}),
        },
    )
    return True


@transaction.atomic(durable=True)
def tool_price_set(*, tool: str, credits: Decimal | None, actor_key_id: str = "", actor: str = "") -> ToolPrice:
    """Set the credits per call of ``tool`` (None: price not set). Quotes and the gateway read it.

    The one path for every price change (console, ``manage.py set_tool_price``): the row is locked and
    changed in place, and a ``ToolPriceChange`` (who, when, old, new) is written in the same transaction.
    Outstanding quotes keep their price (it is frozen in their signed statement). Audited on the system chain.
    """
    tool = tool.strip()
    if not tool or len(tool) > 200:
        raise RequestValidationError.single(["body", "tool"], "A tool name of 1 to 200 characters.", "string_length")
    price = None if credits is None else to_money(credits)
    if price is not None and price < 0:
        raise RequestValidationError.single(["body", "credits"], "Must be 0 or more.", "greater_than_equal")
    # Changed in place under the row lock: the tool is priced before and after, never in between, and
    # concurrent changes serialize so each history row's old price is the one it replaced.
    row = ToolPrice.objects.select_for_update().filter(tool=tool).first()
    old = None if row is None else row.credits
    if row is None:
        row = ToolPrice.objects.create(tool=tool, credits=price)
    else:
        row.credits = price
        row.save(update_fields=["credits", "updated_at"])
    ToolPriceChange.objects.create(
        tool=tool, old_credits=old, new_credits=price, actor=actor, actor_key_id=actor_key_id
    )
    audit_record(
        event="pricing.tool_price_set",
        ok=True,
        key_id=actor_key_id or None,
        tool=tool,
        detail={
            "credits": money(price) if price is not None else None,
            "old_credits": money(old) if old is not None else None,
            **({"actor": actor} if actor else {}),
        },
    )
    return row
