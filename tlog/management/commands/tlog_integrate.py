"""``manage.py tlog_integrate [--once]``: integrate every tenant's pending leaves, sign and witness checkpoints.

Runs beside the gateway (``make run`` starts it; docs/audit-chain.md, "The transparency log"). Each pass
integrates the tenants with pending leaves (several instances may run: a tenant's log lock lets one of
them at a time) and then hands the new checkpoints to the witnesses, whose rounds run in the background
(tlog.witnesses.WitnessRounds: a dead witness never delays a checkpoint); the loop then sleeps
``TLOG_CHECKPOINT_INTERVAL`` seconds, so a statement is in a checkpoint a few seconds after its call.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from common.worker import rounds_run
from tlog.services import INTEGRATE_BATCH, Integrated, tlog_integrate, tlog_tenants_pending
from tlog.witnesses import WitnessRounds, tlog_witnesses_cosign

logger = logging.getLogger("tollgate.tlog")


def integrate_pass(rounds: WitnessRounds | None = None) -> int:
    """One pass over the tenants with pending leaves; the number of leaves integrated.

    Every tenant's checkpoints are committed first; the witnesses are asked after, outside any
    transaction: handed to ``rounds`` (the loop's, which it does not wait for), or, without it, asked
    here, all witnesses at once for each checkpoint (``--once``).
    """
    count = 0
    committed: list[Integrated] = []
    for tenant_id in tlog_tenants_pending():
        while True:
            done = tlog_integrate(tenant_id=tenant_id)
            if done is None:
                break
            count += done.size - done.old_size
            committed.append(done)
            if done.size - done.old_size < INTEGRATE_BATCH:  # the rest waits for the next pass
                break
    if rounds is not None:
        rounds.submit(committed)
        return count
    for done in committed:
        tlog_witnesses_cosign(
            tenant_id=done.tenant_id, old_size=done.old_size, size=done.size, checkpoint_note=done.checkpoint
        )
    return count


class Command(BaseCommand):
    help = "Integrate pending transparency-log leaves and sign each tenant's checkpoint (loop; --once for one pass)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="One pass, then exit.")

    def handle(self, *args: Any, **options: Any) -> None:
        rounds = None if options["once"] else WitnessRounds()

        def one_pass() -> None:
            count = integrate_pass(rounds)
            if options["once"]:
                self.stdout.write(f"integrated {count} leaves\n")
            elif count:
                logger.info("tlog: integrated %s leaves", count)

        try:
            rounds_run(one_pass, loop=not options["once"], interval=settings.TLOG_CHECKPOINT_INTERVAL)
        finally:
            if rounds is not None:
                rounds.shutdown()
