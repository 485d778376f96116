"""The gateway app: registers what apps below it may ask of the tool registry and of the calls."""

from __future__ import annotations

from django.apps import AppConfig


class McpgatewayConfig(AppConfig):
    name = "mcpgateway"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Permits sits below the gateway (docs/architecture.md, "The apps") and cannot import the tool registry;
        # the approval card asks for tool descriptions through this hook.
        from mcpgateway.models import Tool, UpstreamServer
        from permits import selectors

        def describe(names: list[str]) -> dict[str, str]:
            return dict(Tool.objects.filter(service_id__in=names).values_list("service_id", "description"))

        def known() -> list[str]:
            return list(Tool.objects.filter(enabled=True).values_list("service_id", flat=True))

        def servers() -> list[str]:
            return list(UpstreamServer.objects.order_by("slug").values_list("slug", flat=True))

        selectors.describe_tools = describe
        selectors.known_tools = known
        selectors.known_servers = servers

        # Billing sits below the gateway and receipts too; closing a wallet asks whether a refund may
        # still come back to it.
        from billing.services import wallets
        from mcpgateway.selectors import wallet_open_calls

        wallets.open_calls = wallet_open_calls

        # The console index asks each app for its figures (common.console).
        from common.console import console_figures_register
        from mcpgateway.selectors import console_figures

        console_figures_register(console_figures)
