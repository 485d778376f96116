"""``{{ amount|credits }}``: credits for people (thousands separators, no trailing zeros)."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from django import template

from billing.exceptions import money_display

register = template.Library()


@register.filter
def credits(value: Any) -> str:
    if value is None or value == "":
        return "—"
    try:
        return money_display(Decimal(str(value)))
    except (InvalidOperation, ValueError):
        return str(value)
