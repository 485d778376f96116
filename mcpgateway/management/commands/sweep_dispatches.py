"""Turn lost dispatch claims into delivery_uncertain (with receipt, audit event and alert). Never re-sends.

Each sweep also deletes ended and expired MCP sessions (``MCP_SESSION_TTL_SECONDS``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand

from common.worker import rounds_run
from mcpgateway.services import action_sweep, mcp_sessions_purge, sweep_threshold


class Command(BaseCommand):
    help = "Sweep dispatch claims older than the dispatch timeout plus a margin into delivery_uncertain."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--loop", action="store_true", help="keep sweeping until interrupted")
        parser.add_argument("--interval", type=float, default=10.0, help="seconds between sweeps with --loop")
        parser.add_argument("--older-than", type=float, default=None, help="override the age threshold (seconds)")

    def handle(self, *args: Any, **options: Any) -> None:
        older = timedelta(seconds=options["older_than"]) if options["older_than"] is not None else None
        self.stdout.write(f"sweeping claims older than {(older or sweep_threshold()).total_seconds():.0f}s")

        def sweep() -> None:
            swept = action_sweep(older_than=older)
            if swept:
                self.stdout.write(f"delivery_uncertain: {', '.join(swept)}")
            purged = mcp_sessions_purge()
            if purged:
                self.stdout.write(f"MCP sessions ended or expired, deleted: {purged}")

        rounds_run(sweep, loop=options["loop"], interval=options["interval"])
