"""Prices per service category and per tool; every change owns its transaction and is audited."""

from __future__ import annotations

from decimal import Decimal

from django.db import transaction

from audit.services import audit_record
from billing.exceptions import money
from billing.models import ServiceCategory, ServicePrice, ToolPrice
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
