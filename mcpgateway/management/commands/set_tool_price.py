"""Set (or clear) the price of one call of a tool, for scripts; the admin console does the same."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from billing.services import tool_price_set
from mcpgateway.models import Tool


class Command(BaseCommand):
    help = "Set the credits charged per call of a tool: set_tool_price NAME CREDITS (or 'none' to unset)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("name")
        parser.add_argument("credits")

    def handle(self, *args: Any, **options: Any) -> None:
        name, raw = options["name"], options["credits"]
        if not Tool.objects.filter(service_id=name).exists():
            raise CommandError(f"Unknown tool {name!r}: run sync_tools first.")
        credits: Decimal | None
        if raw.lower() == "none":
            credits = None
        else:
            try:
                credits = Decimal(raw)
            except InvalidOperation as exc:
                raise CommandError(f"Not a number: {raw!r}") from exc
            if not credits.is_finite() or credits < 0 or credits.as_tuple().exponent < -8:  # type: ignore[operator]
                raise CommandError("Credits must be >= 0 with at most 8 decimal places.")
        tool_price_set(tool=name, credits=credits, actor="manage.py set_tool_price")
        self.stdout.write(self.style.SUCCESS(f"{name}: {credits if credits is not None else 'price unset'}"))
