"""``{{ amount|credits }}`` (``5,800.50``), ``{{ amount|credits:"full" }}`` (``5,800.50000000``) and
``{{ moment|timestamp }}`` (``2026-11-27 16:29:10 UTC``): ``common.formatting``, the one rule."""

from __future__ import annotations

from typing import Any

from django import template

from common.formatting import credits_text, timestamp_text

register = template.Library()


@register.filter
def credits(value: Any, form: str = "") -> str:
    return credits_text(value, full=form == "full")


@register.filter
def timestamp(value: Any) -> str:
    return timestamp_text(value)
