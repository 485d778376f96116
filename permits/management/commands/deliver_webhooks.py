"""Send the approvers' webhook notifications that are due (``permits.services.notifications``).

``make run`` runs it with ``--loop`` beside the dispatch sweeper; deployments run it the same way
(any number of copies: each delivery is claimed by one).
"""

from __future__ import annotations

import signal
import time
from typing import Any

from django.core.management.base import BaseCommand
from django.db import close_old_connections

from permits.services import webhook_deliver_due


class Command(BaseCommand):
    help = "Deliver due webhook notifications of permit requests (retries with backoff)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--loop", action="store_true", help="keep delivering until interrupted")
        parser.add_argument("--interval", type=float, default=2.0, help="seconds between rounds with --loop")

    def handle(self, *args: Any, **options: Any) -> None:
        stop = False

        def _stop(*_: Any) -> None:
            nonlocal stop
            stop = True

        signal.signal(signal.SIGTERM, _stop)
        while True:
            close_old_connections()
            for delivery in webhook_deliver_due():
                self.stdout.write(f"webhook {delivery.delivery_id}: {delivery.status} after {delivery.attempts}")
            if not options["loop"] or stop:
                break
            deadline = time.monotonic() + options["interval"]
            while time.monotonic() < deadline and not stop:
                time.sleep(0.2)
            if stop:
                break
