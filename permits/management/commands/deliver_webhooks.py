"""Send the approvers' webhook notifications that are due (``permits.services.notifications``).

``make run`` runs it with ``--loop`` beside the dispatch sweeper; deployments run it the same way
(any number of copies: each delivery is claimed by one).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from common.worker import rounds_run
from permits.services import webhook_deliver_due


class Command(BaseCommand):
    help = "Deliver due webhook notifications of permit requests (retries with backoff)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--loop", action="store_true", help="keep delivering until interrupted")
        parser.add_argument("--interval", type=float, default=2.0, help="seconds between rounds with --loop")

    def handle(self, *args: Any, **options: Any) -> None:
        def deliver() -> None:
            for delivery in webhook_deliver_due():
                self.stdout.write(f"webhook {delivery.delivery_id}: {delivery.status} after {delivery.attempts}")

        rounds_run(deliver, loop=options["loop"], interval=options["interval"])
