"""How credits and times read for people, in one place (docs/decisions.md, Operator console, "Money
and time read the same everywhere").

Lists, cards, emails, webhook bodies and console messages use ``credits_text`` (and the
``{{ amount|credits }}`` filter); detail pages and exports use ``full=True``. The API's JSON keeps its
own fixed eight-decimal strings (``billing.exceptions.money``): that is an interface, not prose.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from django.utils import timezone

# Credits carry eight decimal places (the ledger's NUMERIC scale).
CREDIT_PLACES = Decimal("0.00000001")
EMPTY = "—"


def credits_text(value: Any, *, full: bool = False) -> str:
    """``value`` credits for people: thousands separators and at least two decimals.

    Short form (lists, cards, emails, messages): no trailing zeros past the second decimal
    (``5,000.00``, ``5,800.50``, ``0.75``, ``0.12345``). ``full=True`` (detail pages, exports):
    all eight decimals (``5,000.00000000``). None or empty is a dash; text that is not a number is
    returned as it is.
    """
    if value is None or value == "":
        return EMPTY
    try:
        amount = Decimal(str(value)).quantize(CREDIT_PLACES)
    except (InvalidOperation, ValueError):
        return str(value)
    text = f"{amount:,f}"
    if full:
        return text
    whole, _, fraction = text.partition(".")
    fraction = fraction.rstrip("0").ljust(2, "0")
    return f"{whole}.{fraction}"


def credits_phrase(value: Any, *, full: bool = False) -> str:
    """``credits_text`` with its unit: ``3.00 credits``. Amounts always show decimals, and English
    takes the plural after a decimal figure ("1.00 credits"), so the unit is always ``credits``."""
    return f"{credits_text(value, full=full)} credits"


def timestamp_text(value: datetime | None) -> str:
    """A moment for people, to the second and with its zone: ``2026-11-27 16:29:10 UTC``
    (the project's ``TIME_ZONE``; the console's ``DATETIME_FORMAT`` is the same)."""
    if value is None:
        return EMPTY
    local = timezone.localtime(value) if timezone.is_aware(value) else value
    return local.strftime("%Y-%m-%d %H:%M:%S ") + (local.tzname() or "UTC")
