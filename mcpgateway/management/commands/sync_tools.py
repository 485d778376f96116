"""Register the configured upstream's tools (and the dogfood tool when its flag is on)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from mcpgateway import services
from mcpgateway.upstream.client import UpstreamClient, UpstreamError


class Command(BaseCommand):
    help = "Fetch tools/list from UPSTREAM_MCP_URL and register the tools (prices are set separately)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--url", default="", help="upstream MCP URL (default: UPSTREAM_MCP_URL)")

    def handle(self, *args: Any, **options: Any) -> None:
        url = options["url"] or settings.UPSTREAM_MCP_URL
        if settings.ENABLE_DOGFOOD_TOOL:
            services.dogfood_tool_register()
            self.stdout.write(f"registered local tool {services.DOGFOOD_TOOL}")
        if not url:
            raise CommandError("No upstream: set UPSTREAM_MCP_URL or pass --url.")
        with UpstreamClient(
            url, connect_timeout=settings.UPSTREAM_CONNECT_TIMEOUT, read_timeout=settings.UPSTREAM_READ_TIMEOUT
        ) as client:
            try:
                tools = client.list_tools()
            except UpstreamError as exc:
                raise CommandError(f"tools/list failed at {url}: {exc}") from exc
        report = services.tools_sync(remote_tools=tools)
        self.stdout.write(
            self.style.SUCCESS(
                f"{len(tools)} tool(s) from {url}: {len(report.created)} new, {len(report.updated)} updated, "
                f"{len(report.disabled)} disabled"
            )
        )
        for name in report.created:
            if name not in report.invalid and name not in report.unusable:
                self.stdout.write(f"  new: {name} (no price yet: manage.py set_tool_price {name} CREDITS)")
        for name, problem in report.invalid.items():
            self.stderr.write(
                self.style.WARNING(f"  not callable: {name}: its outputSchema is not a valid JSON Schema ({problem})")
            )
        for name, problem in report.unusable.items():
            self.stderr.write(
                self.style.WARNING(
                    f"  not callable: {name}: its inputSchema cannot be used to validate arguments ({problem})"
                )
            )
