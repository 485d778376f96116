"""``manage.py tlog_integrate [--once]``: integrate every tenant's pending leaves, sign and witness checkpoints.

Runs beside the gateway (``make run`` starts it; docs/audit-chain.md, "The transparency log"). Each pass
integrates the tenants with pending leaves (several instances may run: a tenant's log lock lets one of
them at a time) and asks the witnesses to cosign each new checkpoint; the loop then sleeps
``TLOG_CHECKPOINT_INTERVAL`` seconds, so a statement is in a checkpoint a few seconds after its call.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from common.worker import rounds_run
from tlog.services import INTEGRATE_BATCH, tlog_integrate, tlog_tenants_pending
from tlog.witnesses import tlog_witnesses_cosign

logger = logging.getLogger("tollgate.tlog")


def integrate_pass() -> int:
    """One pass over the tenants with pending leaves; the number of leaves integrated."""
    count = 0
    for tenant_id in tlog_tenants_pending():
        while True:
            done = tlog_integrate(tenant_id=tenant_id)
            if done is None:
                break
            count += done.size - done.old_size
            tlog_witnesses_cosign(
                tenant_id=tenant_id, old_size=done.old_size, size=done.size, checkpoint_note=done.checkpoint
            )
            if done.size - done.old_size < INTEGRATE_BATCH:  # the rest waits for the next pass
                break
    return count


class Command(BaseCommand):
    help = "Integrate pending transparency-log leaves and sign each tenant's checkpoint (loop; --once for one pass)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="One pass, then exit.")

    def handle(self, *args: Any, **options: Any) -> None:
        def one_pass() -> None:
            count = integrate_pass()
            if options["once"]:
                self.stdout.write(f"integrated {count} leaves\n")
            elif count:
                logger.info("tlog: integrated %s leaves", count)

        rounds_run(one_pass, loop=not options["once"], interval=settings.TLOG_CHECKPOINT_INTERVAL)
