"""Run the bundled demo upstream MCP server (``mcpgateway.demo_upstream``) on 127.0.0.1.

Point ``UPSTREAM_MCP_URL`` at ``http://127.0.0.1:<port>/mcp`` to use it.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from mcpgateway.demo_upstream import serve


class Command(BaseCommand):
    help = "Serve the demo upstream MCP server (Streamable HTTP, JSON responses) at http://127.0.0.1:PORT/mcp."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=8765)
        parser.add_argument("--stateless", action="store_true", help="serve without Mcp-Session-Id sessions")

    def handle(self, *args: Any, **options: Any) -> None:
        port: int = options["port"]
        self.stdout.write(f"Demo upstream MCP server at http://127.0.0.1:{port}/mcp (stats at /stats)")
        serve(port=port, stateless=options["stateless"])
