"""The audit app: registers its figures on the console index at start-up (docs/decisions.md, Foundation)."""

from __future__ import annotations

from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "audit"

    def ready(self) -> None:
        from audit.selectors import console_figures
        from common.console import console_figures_register

        console_figures_register(console_figures)
        _index_expressions_take_opclasses()


def _index_expressions_take_opclasses() -> None:
    """Let an index expression carry its operator class (``OpClass``), as the search index on
    ``audit_detail_refs(detail)`` does: ``django.contrib.postgres`` registers this in its ``ready``, and
    that app is not installed (its connection hooks and lookups are not wanted). Without it Django
    writes ``((expr opclass))``, which PostgreSQL refuses."""
    from django.contrib.postgres.indexes import OpClass
    from django.db.models import OrderBy
    from django.db.models.functions import Collate
    from django.db.models.indexes import IndexExpression

    IndexExpression.register_wrappers(OrderBy, OpClass, Collate)
