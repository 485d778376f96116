"""The billing app: registers its figures on the console index and, for access below it, its wallet
directory (``access.wallets``) at start-up (docs/decisions.md, Foundation)."""

from __future__ import annotations

from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"

    def ready(self) -> None:
        import billing.refusals  # noqa: F401  (registers billing's refusal codes: common.refusals)
        from access.wallets import wallet_directory_register
        from billing.selectors import console_figures, wallet_directory
        from common.console import console_figures_register

        console_figures_register(console_figures)
        wallet_directory_register(wallet_directory())
