"""The permits app: registers its figures on the console index at start-up (docs/decisions.md, Foundation)."""

from __future__ import annotations

from django.apps import AppConfig


class PermitsConfig(AppConfig):
    name = "permits"

    def ready(self) -> None:
        import permits.refusals  # noqa: F401  (registers the permit's and the quote's refusal codes: common.refusals)
        from common.console import console_figures_register
        from permits.selectors import console_figures

        console_figures_register(console_figures)
