"""Console list columns that keep a list readable at 1366 px (docs/decisions.md, Operator console):
ids shortened with the full id on hover and in the link. Imports no app, so every app's admin uses it."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils.html import format_html


def short_id(value: str | None) -> str:
    """An id shortened for a list (``rcpt_so83X8vv…``), the full id on hover. Lists at 1366 px show
    their key columns beside 22-character ids only when the ids are shortened (docs/decisions.md,
    Operator console)."""
    if not value:
        return "—"
    prefix, _, rest = value.partition("_")
    shown = f"{prefix}_{rest[:8]}…" if len(rest) > 10 else value
    return format_html('<span class="short-id" title="{}">{}</span>', value, shown)


def short_id_column(field: str, description: str, *, link_to: str | None = None) -> Any:
    """A list column showing ``obj.<field>`` as a ``short_id``; ``link_to`` (``app.model``) links it to
    that object's console page (the full id is in the link and on hover). The first column of a
    list takes no ``link_to``: Django links it to the row's own page."""

    @admin.display(description=description, ordering=field)
    def column(modeladmin: admin.ModelAdmin, obj: Any) -> str:
        value = getattr(obj, field)
        if not value or link_to is None:
            return short_id(value)
        app_label, model_name = link_to.split(".")
        url = reverse(f"admin:{app_label}_{model_name}_change", args=[quote(value)])
        return format_html('<a href="{}">{}</a>', url, short_id(value))

    return column
