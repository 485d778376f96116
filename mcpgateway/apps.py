"""The gateway app: registers what apps below it may ask of the tool registry."""

from __future__ import annotations

from django.apps import AppConfig


class McpgatewayConfig(AppConfig):
    name = "mcpgateway"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Permits sits below the gateway (DESIGN.md section 3) and cannot import the tool registry;
        # the approval card asks for tool descriptions through this hook.
        from mcpgateway.models import Tool
        from permits import selectors

        def describe(names: list[str]) -> dict[str, str]:
            return dict(Tool.objects.filter(service_id__in=names).values_list("service_id", "description"))

        selectors.describe_tools = describe
