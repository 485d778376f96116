"""Register the upstream servers' tools (and the dogfood tool when its flag is on).

Without ``--server``, every enabled server (the ``UPSTREAM_MCP_URL`` one first becomes the server
``default``); ``--url`` registers one URL's tools without a server, as before servers were records.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from common.errors import ApplicationError
from mcpgateway import services
from mcpgateway.models import UpstreamServer
from mcpgateway.services.tools import SyncReport
from mcpgateway.services.upstreams import upstream_default_ensure, upstream_server_sync
from mcpgateway.upstream.client import UpstreamClient, UpstreamError


class Command(BaseCommand):
    help = "Fetch tools/list from each upstream server (or one) and register the tools (prices are set separately)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--server", default="", help="the slug of one upstream server (default: every enabled one)")
        parser.add_argument("--url", default="", help="an upstream MCP URL whose tools are registered without a server")

    def handle(self, *args: Any, **options: Any) -> None:
        if settings.ENABLE_DOGFOOD_TOOL:
            services.dogfood_tool_register()
            self.stdout.write(f"registered local tool {services.DOGFOOD_TOOL}")
        if options["url"]:
            self._sync_url(options["url"])
            return
        try:
            upstream_default_ensure()
        except ApplicationError as exc:
            raise CommandError(exc.detail_message) from exc
        servers = UpstreamServer.objects.filter(enabled=True)
        if options["server"]:
            servers = UpstreamServer.objects.filter(slug=options["server"])
            if not servers.exists():
                raise CommandError(f"No upstream server {options['server']!r}.")
        if not servers.exists():
            raise CommandError("No upstream: set UPSTREAM_MCP_URL, add a server in the console, or pass --url.")
        failed = []
        for server in servers:
            try:
                tools_count, report = self._sync_server(server)
            except UpstreamError as exc:
                self.stderr.write(self.style.ERROR(f"tools/list failed at server {server.slug}: {exc}"))
                failed.append(server.slug)
                continue
            self._print(f"server {server.slug} ({server.url})", tools_count, report)
        if failed:
            raise CommandError(f"tools/list failed at {', '.join(failed)}")

    def _sync_server(self, server: UpstreamServer) -> tuple[int, SyncReport]:
        report = upstream_server_sync(server=server, actor="sync_tools")
        return len(report.created) + len(report.updated) + len(report.refused), report

    def _sync_url(self, url: str) -> None:
        with UpstreamClient(
            url, connect_timeout=settings.UPSTREAM_CONNECT_TIMEOUT, read_timeout=settings.UPSTREAM_READ_TIMEOUT
        ) as client:
            try:
                tools = client.list_tools()
            except UpstreamError as exc:
                raise CommandError(f"tools/list failed at {url}: {exc}") from exc
        self._print(url, len(tools), services.tools_sync(remote_tools=tools))

    def _print(self, where: str, listed: int, report: SyncReport) -> None:
        self.stdout.write(
            self.style.SUCCESS(
                f"{listed} tool(s) from {where}: {len(report.created)} new, {len(report.updated)} updated, "
                f"{len(report.disabled)} disabled" + (f", {len(report.refused)} refused" if report.refused else "")
            )
        )
        for name in report.created:
            if name not in report.invalid and name not in report.unusable:
                self.stdout.write(f"  new: {name} (no price yet: manage.py set_tool_price {name} CREDITS)")
        for name in report.changed:
            self.stdout.write(f"  changed: {name}")
        for name in report.disabled:
            self.stdout.write(f"  disabled: {name} (no longer listed)")
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
        for reason in report.refused.values():
            self.stderr.write(self.style.WARNING(f"  refused: {reason}"))
