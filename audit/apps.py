"""The audit app: registers its figures on the console index at start-up (docs/decisions.md, Foundation)."""

from __future__ import annotations

from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "audit"

    def ready(self) -> None:
        from audit.selectors import console_figures
        from common.console import console_figures_register

        console_figures_register(console_figures)
